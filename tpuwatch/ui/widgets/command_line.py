"""One line with the state of the latest profile/checkpoint commands."""

from __future__ import annotations

from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

from tpuwatch.monitor.snapshot import CommandView, RunSnapshot
from tpuwatch.ui import units

_STYLE = {
    "pending": "$text-muted",
    "queued": "$text-muted",
    "running": "$primary bold",
    "done": "$success",
    "failed": "$error bold",
}


def command_summary(c: CommandView) -> Content:
    words = {"pending": "sent…", "queued": "queued…", "running": "running…", "done": "done", "failed": "failed"}
    parts: list[Content | tuple[str, str] | str] = [(f"{c.action} ", "bold"), (words.get(c.status, c.status), _STYLE.get(c.status, ""))]
    d = c.details
    if c.status == "done":
        extras = []
        if isinstance(d.get("path"), str):
            extras.append(str(d["path"]))
        if isinstance(d.get("bytes"), (int, float)):
            extras.append(units.size(d["bytes"]))  # type: ignore[arg-type]
        if isinstance(d.get("seconds"), (int, float)):
            extras.append(units.duration(d["seconds"]))  # type: ignore[arg-type]
        if extras:
            parts.append(": " + " · ".join(extras))
        elif c.message:
            parts.append(": " + c.message)
    elif c.status == "failed" and c.message:
        parts.append(": " + c.message)
    return Content.assemble(*parts)


def commands_text(s: RunSnapshot) -> Content:
    latest: dict[str, CommandView] = {}
    for c in s.commands:
        if c.action not in latest or c.t >= latest[c.action].t:
            latest[c.action] = c
    views = sorted(latest.values(), key=lambda c: c.t)
    return Content("   ").join(command_summary(c) for c in views)


class CommandLine(Widget):
    """Hidden until a command was sent in this run."""

    DEFAULT_CSS = "CommandLine { height: 1; }"
    snapshot: reactive[RunSnapshot] = reactive(RunSnapshot, always_update=True)

    def render(self) -> Content:
        return commands_text(self.snapshot)

    def watch_snapshot(self, s: RunSnapshot) -> None:
        self.display = bool(s.commands)
        self.set_class(any(c.status == "failed" for c in s.commands), "-critical")

"""The state of the latest command of each kind (profile, checkpoint, stacks): one line each.

One line per kind, not one line for all: at 120 columns a profile's long path used to push the
checkpoint's result off the screen. Paths are shown short (relative to the run directory, or
``~``), and the whole list, with full paths and messages, is in the results screen (``r``).
"""

from __future__ import annotations

from pathlib import Path

from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

from tpuwatch import units
from tpuwatch.monitor.snapshot import CommandView, RunSnapshot

_STYLE = {
    "pending": "$text-muted",
    "queued": "$text-muted",
    "running": "$primary bold",
    "done": "$success",
    "failed": "$error bold",
}
_WORDS = {"pending": "sent…", "queued": "queued…", "running": "running…", "done": "done", "failed": "failed"}
#: Most lines shown under the header; more kinds than this are in the results screen.
MAX_LINES = 3


def short_path(path: str, run_dir: Path | None, home: Path | None = None) -> str:
    """``checkpoints/ckpt-4268`` for a path inside the run directory, ``~/x`` under the home
    directory, anything else (``gs://``, other places) unchanged."""
    if "://" in path:
        return path
    p = Path(path)
    for base, prefix in ((run_dir, ""), (home if home is not None else Path.home(), "~/")):
        if base is None:
            continue
        try:
            rel = p.relative_to(base)
        except ValueError:
            continue
        return prefix + str(rel) if str(rel) != "." else (prefix.rstrip("/") or ".")
    return path


def result_path(c: CommandView) -> str | None:
    d = c.details
    for key in ("path", "local_path", "logdir"):
        if isinstance(d.get(key), str) and d[key]:
            return str(d[key])
    return None


def command_summary(c: CommandView, run_dir: Path | None = None) -> Content:
    """``checkpoint done: checkpoints/ckpt-1 · 40ms``; a failure says why."""
    parts: list[Content | tuple[str, str] | str] = [(f"{c.action} ", "bold"),
                                                   (_WORDS.get(c.status, c.status), _STYLE.get(c.status, ""))]
    d = c.details
    if c.status == "done":
        extras = []
        path = result_path(c)
        if path:
            extras.append(short_path(path, run_dir))
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


def latest_commands(s: RunSnapshot) -> list[CommandView]:
    """The newest command of each kind, oldest first."""
    latest: dict[str, CommandView] = {}
    for c in s.commands:
        if c.action not in latest or c.t >= latest[c.action].t:
            latest[c.action] = c
    return sorted(latest.values(), key=lambda c: c.t)


def commands_text(s: RunSnapshot, run_dir: Path | None = None) -> Content:
    views = latest_commands(s)[-MAX_LINES:]
    return Content("\n").join(command_summary(c, run_dir) for c in views)


class CommandLine(Widget):
    """Hidden until a command was sent in this run; then one line per kind of command."""

    DEFAULT_CSS = "CommandLine { height: auto; max-height: 3; text-wrap: nowrap; text-overflow: ellipsis; }"
    snapshot: reactive[RunSnapshot] = reactive(RunSnapshot, always_update=True)

    def __init__(self, run_dir: Path | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.run_dir = run_dir

    def render(self) -> Content:
        return commands_text(self.snapshot, self.run_dir)

    _lines = 0

    def watch_snapshot(self, s: RunSnapshot) -> None:
        self.display = bool(s.commands)
        latest = latest_commands(s)
        self.set_class(bool(latest) and latest[-1].status == "failed", "-critical")
        lines = min(len(latest), MAX_LINES)
        if lines != self._lines:  # a new kind of command: one more line (height is auto)
            self._lines = lines
            self.refresh(layout=True)

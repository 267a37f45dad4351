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
from tpuwatch.ui.printable_content import printable_content

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
#: An ended command's line goes this long after its result (seconds): at 80x24 three lines kept
#: for the whole session left the Output panel two rows. The toast, ``r`` and the recording
#: keep every result; a command still in flight stays until it ends.
RESULT_SHOWN_S = 12.0


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


def shown_commands(s: RunSnapshot, now: float | None = None) -> list[CommandView]:
    """The newest command of each kind still in flight or ended under ``RESULT_SHOWN_S`` ago."""
    now = s.now if now is None else max(now, s.now)
    return [c for c in latest_commands(s)
            if c.status not in ("done", "failed") or now - c.t < RESULT_SHOWN_S][-MAX_LINES:]


def commands_text(s: RunSnapshot, run_dir: Path | None = None, now: float | None = None) -> Content:
    return Content("\n").join(command_summary(c, run_dir) for c in shown_commands(s, now))


class CommandLine(Widget):
    """Hidden but while a command is in flight or just ended; then one line per kind of command."""

    DEFAULT_CSS = "CommandLine { height: auto; max-height: 3; text-wrap: nowrap; text-overflow: ellipsis; }"
    snapshot: reactive[RunSnapshot] = reactive(RunSnapshot, always_update=True)

    def __init__(self, run_dir: Path | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.run_dir = run_dir

    def render(self) -> Content:
        return printable_content(commands_text(self.snapshot, self.run_dir, self._now))

    _shown: tuple[tuple[str, str], ...] = ()
    _now: float | None = None

    def tick(self, now: float) -> None:
        """The dashboard's time, each refresh: a result line goes even when no new snapshot
        is drawn (an ended run's numbers do not change)."""
        self._now = now
        if self.is_attached:
            self._update(self.snapshot)

    def watch_snapshot(self, s: RunSnapshot) -> None:
        self._update(s)

    def _update(self, s: RunSnapshot) -> None:
        shown = shown_commands(s, self._now)
        self.display = bool(shown)
        self.set_class(bool(shown) and shown[-1].status == "failed", "-critical")
        key = tuple((c.id, c.status) for c in shown)
        if key != self._shown:  # a line more, less or changed (height is auto)
            self._shown = key
            self.refresh(layout=True)

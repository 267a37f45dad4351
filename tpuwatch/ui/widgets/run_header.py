"""The two header lines: what runs where, and how far along it is."""

from __future__ import annotations

import os

from textual.content import Content
from textual.geometry import Region
from textual.reactive import reactive
from textual.widget import Widget

from tpuwatch import units
from tpuwatch.monitor.baseline import deltas
from tpuwatch.monitor.ledger import phase_text
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.printable import one_line
from tpuwatch.ui.printable_content import printable_content

_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}


def elapsed_s(s: RunSnapshot) -> float | None:
    if s.started_t is None:
        return None
    end = s.ended_t if s.ended_t is not None else s.now
    return max(0.0, end - s.started_t)


#: Event sources whose warnings explain why nothing arrives (the remote viewer, the agent's server).
_CONNECTION_SOURCES = ("remote", "transport")


def problem_text(s: RunSnapshot) -> str:
    """Why nothing can be shown, while nothing has been: a refused token, an unreachable agent,
    a file that is not a recording. Empty when all is well (or data has arrived)."""
    if s.status != "waiting":
        return ""
    for e in reversed(s.events):
        if e.source in _CONNECTION_SOURCES and e.level in ("error", "warning"):
            return one_line(e.message)
    if s.malformed and not s.messages:
        return (f"{s.malformed} unreadable line(s) and no tpuwatch message: "
                f"this is not a tpuwatch recording (or a damaged one)")
    return ""


def status_text(s: RunSnapshot) -> tuple[str, str]:
    """(badge text, style) for the run status; the words carry the meaning without colour."""
    if problem_text(s):
        return " NO DATA ", "$error reverse bold"
    if s.catching_up:
        return " CATCHING UP ", "$primary bold"
    if s.status == "crashed":
        if s.exit_signal:
            name = _SIGNALS.get(s.exit_signal, f"signal {s.exit_signal}")
            return f" CRASHED {name} ", "$error reverse bold"
        code = f" exit {s.exit_code}" if s.exit_code is not None else ""
        return f" CRASHED{code} ", "$error reverse bold"
    if s.status == "finished":
        return " FINISHED ", "$success reverse bold"
    if s.status == "stopped":
        code = f" exit {s.exit_code}" if s.exit_code is not None else ""
        return f" STOPPED{code} ", "$warning reverse bold"
    if s.status == "stalled":
        since = s.now - s.last_step_t if s.last_step_t is not None else None
        return f" STALLED {units.clock(since)} ", "$warning reverse bold"
    if s.status == "lost":
        return " LOST CONTACT ", "$warning reverse bold"
    if s.status == "running":
        return " RUNNING ", "$success bold"
    if s.status == "starting":
        return " STARTING ", "$primary bold"
    return " WAITING ", "$text-muted bold"


def identity_text(s: RunSnapshot, room: int | None = None) -> str:
    """What runs where. ``room``: the columns it may take; a long script path gives way first
    (from the left, its file name kept), before the strategy and the replicas."""
    parts = [s.script or "(no run yet)"]
    if s.strategy:
        parts.append(s.strategy)
    if s.replicas:
        parts.append(f"{s.replicas}× {s.device_kind or 'device'}")
    if s.num_workers > 1:
        parts.append(f"{s.num_workers} workers")
    if s.host:
        parts.append(s.host)
    # One line whatever the script's name holds (a newline would push the badge down).
    text = one_line(" · ".join(parts))
    if room is not None and len(text) > room and s.script:
        script = one_line(s.script)
        rest = text[len(script):]  # " · strategy · ..."
        name = os.path.basename(script) or script
        keep = max(len(name), room - len(rest))
        if keep < len(script):
            script = "…" + script[len(script) - keep + 1:] if keep > len(name) else name
        text = script + rest
    return text


def progress_parts(s: RunSnapshot) -> list[str]:
    """Progress facts, most important first (the header drops from the end when narrow)."""
    problem = problem_text(s)
    if problem:
        return [problem]
    if s.disk_full:
        return ["DISK FULL: output and events are being dropped, training goes on", *_progress_parts(s)]
    return _progress_parts(s)


def _progress_parts(s: RunSnapshot) -> list[str]:
    if s.catching_up:
        # The step read so far is history, not the run's: no rate, no ETA until the end is read.
        return [f"catching up on the recording: read up to step {units.integer(s.step)}"]
    if s.status == "waiting":
        return ["waiting for the agent's first message"]
    if s.step == 0 and s.status == "starting":
        starting = ["waiting for the first step"]
        if s.started_t is not None:
            starting.append(units.clock(elapsed_s(s)))
        return starting
    if s.total_steps:
        pct = min(100, int(100 * s.step / s.total_steps))
        parts = [f"step {units.integer(s.step)}/{units.integer(s.total_steps)} ({pct}%)"]
    else:
        parts = [f"step {units.integer(s.step)}"]
    if s.epoch is not None:
        parts.append(f"epoch {s.epoch + 1}/{s.epochs}" if s.epochs else f"epoch {s.epoch + 1}")
    if s.phase and s.status in ("running", "stalled", "starting"):
        parts.insert(1, phase_text(s.phase, s.phase_since, s.now))  # "evaluating 2:31"
    parts.append(units.clock(elapsed_s(s)))
    if s.steps_per_s is not None and s.status in ("running", "stalled"):
        parts.append(f"{units.count(s.steps_per_s)} steps/s")
    if s.examples_per_s is not None and s.status in ("running", "stalled"):
        parts.append(f"{units.count(s.examples_per_s)} ex/s")
    if s.eta_s is not None and s.status == "running":
        parts.append(f"ETA {units.clock(s.eta_s)}")
    if s.status in ("running", "stalled"):
        parts.extend(deltas(s))
    return parts


def header_text(s: RunSnapshot, width: int) -> Content:
    badge, badge_style = status_text(s)
    room = max(0, width - len(badge) - 1)
    ident = identity_text(s, room)
    if len(ident) > room:
        ident = ident[: max(0, room - 1)] + "…"
    line1 = Content.assemble((ident, "bold"), " " * (width - len(ident) - len(badge)), (badge, badge_style))
    problem = problem_text(s)
    if problem:  # the whole reason, cut only at the edge of the screen
        text = problem if len(problem) <= width else problem[: max(0, width - 1)] + "…"
        return Content.assemble(line1, "\n", (text, "$error bold"))
    shown: list[str] = []
    for part in progress_parts(s):
        if len(" · ".join([*shown, part])) > width:
            break
        shown.append(part)
    return Content.assemble(line1, "\n", " · ".join(shown))


class RunHeader(Widget):
    """Script, strategy, replicas × device, host, status; step, epoch, elapsed, speeds, ETA.

    Repaints only the line that changed: the first (what runs where, the status) seldom does.
    """

    DEFAULT_CSS = "RunHeader { height: 2; }"
    snapshot: reactive[RunSnapshot] = reactive(RunSnapshot, always_update=True, repaint=False)
    _drawn: tuple[int, Content, list[str]] | None = None  # (width, content, plain lines)

    def render(self) -> Content:
        return self._draw()[1]

    def _draw(self) -> tuple[int, Content, list[str]]:
        width = self.size.width
        if self._drawn is None or self._drawn[0] != width:
            content = printable_content(header_text(self.snapshot, width))
            self._drawn = (width, content, [line.plain for line in content.split("\n")])
        return self._drawn

    def watch_snapshot(self, s: RunSnapshot) -> None:
        self.set_class(s.status in ("stalled", "lost"), "-stale")
        self.set_class(s.status == "crashed" or bool(problem_text(s)), "-critical")
        old, self._drawn = self._drawn, None
        if old is None or not self.is_mounted:
            self.refresh()
            return
        new = self._draw()
        if len(old[2]) != len(new[2]):
            self.refresh()
            return
        # Styles follow the text here (the badge's colour is its word), so the text decides.
        for row, (a, b) in enumerate(zip(old[2], new[2])):
            if a != b:
                self.refresh(Region(0, row, self.size.width, 1))

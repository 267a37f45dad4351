"""The replay transport line: playing/paused, speed, position in the recording, keys."""

from __future__ import annotations

from dataclasses import dataclass

from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

from tpuwatch import units


@dataclass(frozen=True)
class ReplayState:
    paused: bool
    speed: float
    position_s: float  # from the start of the recording
    duration_s: float
    at_end: bool


def replay_text(r: ReplayState) -> Content:
    mode = "ended" if r.at_end else "paused" if r.paused else "playing"
    speed = f"{r.speed:g}×"
    return Content.assemble(
        (" REPLAY ", "$primary reverse bold"), " ",
        (mode, "bold"), f" {speed}  ",
        f"{units.clock(r.position_s)} / {units.clock(r.duration_s)}",
        # At most 80 columns at its longest (paused 0.25×, 9:59:59): home/end are in the help.
        ("  space pause · +/- speed · ←/→ seek 5%", "dim"),
    )


class ReplayBar(Widget):
    DEFAULT_CSS = "ReplayBar { height: 1; }"
    state: reactive[ReplayState | None] = reactive(None)

    def render(self) -> Content:
        return replay_text(self.state) if self.state else Content("")

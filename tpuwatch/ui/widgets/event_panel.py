"""The run's event log, newest at the bottom, stamped with time since the run started."""

from __future__ import annotations

from textual.content import Content

from tpuwatch import units
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.ui.widgets.panel import Panel

_LEVEL = {"error": ("ERR ", "$error bold"), "warning": ("WARN", "$warning bold"), "info": ("info", "dim"),
          "debug": ("dbg ", "dim")}


def events_text(s: RunSnapshot, rows: int) -> Content:
    if not s.events:
        return Content.styled("no events", "dim")
    origin = s.started_t if s.started_t is not None else s.events[0].t
    lines = []
    for e in s.events[-rows:]:
        level, style = _LEVEL.get(e.level, (e.level[:4], ""))
        lines.append(Content.assemble(
            (f"{units.clock(e.t - origin):>6} ", "dim"), (level, style), f" {e.source}: {e.message}"
        ))
    return Content("\n").join(lines)


class EventPanel(Panel):
    TITLE = "7 Events"  # the number key that jumps here

    def body(self, snapshot: RunSnapshot, rows: int, width: int) -> Content:
        return events_text(snapshot, rows)

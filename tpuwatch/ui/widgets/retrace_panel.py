"""Retraces: per tf.function, how often it was traced, how many objects, and what changed."""

from __future__ import annotations

from textual.content import Content

from tpuwatch import units
from tpuwatch.monitor.snapshot import FunctionTraces, RunSnapshot
from tpuwatch.ui.widgets.panel import Panel

#: More traces than this for one function is worth a look (shapes or Python values changing).
TRACES_WARN = 2


def _suspicious(f: FunctionTraces) -> bool:
    return f.traces > TRACES_WARN or f.instances > 1


def _cut(name: str, width: int) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def retrace_text(s: RunSnapshot, rows: int, width: int) -> Content:
    if not s.functions:
        return Content.styled("no tf.function traced yet", "dim")
    # Names as long as they are (up to what leaves 16 columns for counts and the change).
    name_w = max(8, min(max(len(f.name) for f in s.functions), width - 22))
    lines = [Content.styled(f"{'function':<{name_w}} {'traces':>6} {'inst':>4}  last change", "dim")]
    funcs = sorted(s.functions, key=lambda f: (-f.traces, f.name))
    for f in funcs[: max(0, rows - 1)]:
        change = f.last_change or "(first trace)"
        where = f" @{units.integer(f.last_step)}" if f.last_step is not None else ""
        style = "$warning bold" if _suspicious(f) else ""
        lines.append(Content.assemble(
            (f"{_cut(f.name, name_w):<{name_w}} {f.traces:>6} {f.instances:>4}", style), f"  {change}{where}"
        ))
    return Content("\n").join(lines)


class RetracePanel(Panel):
    TITLE = "Retraces"

    def body(self, snapshot: RunSnapshot, rows: int, width: int) -> Content:
        return retrace_text(snapshot, rows, width)

    def state(self, snapshot: RunSnapshot) -> str | None:
        return "-warning" if any(_suspicious(f) for f in snapshot.functions) else None

"""Retraces: per tf.function, how often it was traced, how many objects, and what changed;
expanded (z or Enter), every trace in order with its step and the whole change."""

from __future__ import annotations

import re

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
    """Per function: name, traces and objects on one line, its last change (and step) on the
    next, indented, so neither is cut in a third of 80 or 120 columns (the body wraps a change
    longer than the panel)."""
    if not s.functions:
        return Content.styled("no tf.function traced yet", "dim")
    # Names as long as they are (up to what leaves 12 columns for the counts).
    name_w = max(8, min(max(len(f.label) for f in s.functions), width - 12))
    lines = [Content.styled(f"{'function':<{name_w}} {'traces':>6} {'objs':>4}", "dim")]
    funcs = sorted(s.functions, key=lambda f: (-f.traces, f.label))
    for f in funcs[: max(0, (rows - 1) // 2)]:
        where = f" at step {units.integer(f.last_step)}" if f.last_step is not None else ""
        change = f"changed {f.last_change}" if f.last_change else "first trace"
        style = "$warning bold" if _suspicious(f) else ""
        lines.append(Content.styled(f"{_cut(f.label, name_w):<{name_w}} {f.traces:>6} {f.instances:>4}", style))
        lines.append(Content.assemble("  ", (f"{change}{where}", "dim")))
    return Content("\n").join(lines)


#: A signature's last leaf's replica count (" x4") and closing brackets: kept when it is cut.
_TAIL = re.compile(r"\s+x\d+[)\]]*$")


def fit_signature(signature: str, room: int) -> str:
    """One line: cut in the middle rather than wrapped, so " x4" never sits on a line alone."""
    if len(signature) <= room:
        return signature
    tail = m.group(0) if (m := _TAIL.search(signature)) else ""
    return signature[: max(1, room - len(tail) - 1)] + "…" + tail


def retraces_text(s: RunSnapshot, width: int = 80) -> Content:
    """Oldest first: step, run time, function and trace number, then the change (wrapped by the
    panel, never cut) and the new signature (one line, cut in the middle if longer)."""
    if not s.retraces:
        return Content.styled("No tf.function traced yet.", "dim")
    origin = s.started_t if s.started_t is not None else s.retraces[0].t
    lines: list[Content] = []
    for r in s.retraces:
        step = f"step {units.integer(r.step)}" if r.step is not None else "before the first step"
        lines.append(Content.assemble(
            (f"{units.clock(r.t - origin):>7}  ", "dim"), (units.function_label(r.function, r.evaluation), "bold"),
            (f"  trace {r.traces}", ""), (f" of {r.instances} object(s)" if r.instances > 1 else "", "$warning"),
            (f"  {step}", "dim"),
        ))
        lines.append(Content.assemble(("         change    ", "dim"), r.change or "(first trace)"))
        lines.append(Content.assemble(("         signature ", "dim"),
                                      fit_signature(r.signature, width - 19)))
    total = len(s.retraces)
    shown_of = max((f.traces for f in s.functions), default=total)
    head = Content.styled(f"{total} trace(s), oldest first"
                          + (" (the oldest dropped)" if shown_of > total else ""), "dim")
    return Content("\n").join([head, Content(""), *lines])


class RetracePanel(Panel):
    TITLE = "6 Retraces"  # the number key that jumps here

    def body(self, snapshot: RunSnapshot, rows: int, width: int) -> Content:
        if self.has_class("-maximised"):
            return retraces_text(snapshot, width)
        return retrace_text(snapshot, rows, width)

    def state(self, snapshot: RunSnapshot) -> str | None:
        return "-warning" if any(_suspicious(f) for f in snapshot.functions) else None

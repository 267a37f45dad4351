"""Every trace of every tf.function, in order, with its step and the whole change (Enter or z on
the Retraces panel)."""

from __future__ import annotations

import re

from textual.content import Content

from tpuwatch import units
from tpuwatch.monitor.diagnostics.tracing import function_label
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.ui.screens.text_screen import TextScreen

#: A signature's last leaf's replica count (" x4") and closing brackets: kept when it is cut.
_TAIL = re.compile(r"\s+x\d+[)\]]*$")
#: Columns the screen's scrollbar may take from the text.
_SCROLLBAR = 2


def fit_signature(signature: str, room: int) -> str:
    """One line: cut in the middle rather than wrapped, so " x4" never sits on a line alone."""
    if len(signature) <= room:
        return signature
    tail = m.group(0) if (m := _TAIL.search(signature)) else ""
    return signature[: max(1, room - len(tail) - 1)] + "…" + tail


def retraces_text(s: RunSnapshot, width: int = 80) -> Content:
    """Oldest first: step, run time, function and trace number, then the change (wrapped by the
    screen, never cut) and the new signature (one line, cut in the middle if longer)."""
    if not s.retraces:
        return Content.styled("No tf.function traced yet.", "dim")
    origin = s.started_t if s.started_t is not None else s.retraces[0].t
    lines: list[Content] = []
    for r in s.retraces:
        step = f"step {units.integer(r.step)}" if r.step is not None else "before the first step"
        lines.append(Content.assemble(
            (f"{units.clock(r.t - origin):>7}  ", "dim"), (function_label(r.function, r.evaluation), "bold"),
            (f"  trace {r.traces}", ""), (f" of {r.instances} object(s)" if r.instances > 1 else "", "$warning"),
            (f"  {step}", "dim"),
        ))
        lines.append(Content.assemble(("         change    ", "dim"), r.change or "(first trace)"))
        lines.append(Content.assemble(("         signature ", "dim"),
                                      fit_signature(r.signature, width - 19 - _SCROLLBAR)))
    total = len(s.retraces)
    shown_of = max((f.traces for f in s.functions), default=total)
    head = Content.styled(f"{total} trace(s), oldest first"
                          + (" (the oldest dropped)" if shown_of > total else ""), "dim")
    return Content("\n").join([head, Content(""), *lines])


class RetracesScreen(TextScreen):
    def __init__(self, snapshot: RunSnapshot) -> None:
        super().__init__("Retraces", lambda s, w: retraces_text(s, w), snapshot)

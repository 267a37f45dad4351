"""Every trace of every tf.function, in order, with its step and the whole change (Enter or z on
the Retraces panel)."""

from __future__ import annotations

from textual.content import Content

from tpuwatch import units
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.ui.screens.text_screen import TextScreen


def retraces_text(s: RunSnapshot, width: int = 80) -> Content:
    """Oldest first: step, run time, function and trace number, then the change and the new
    signature on lines of their own (wrapped by the screen, never cut)."""
    if not s.retraces:
        return Content.styled("No tf.function traced yet.", "dim")
    origin = s.started_t if s.started_t is not None else s.retraces[0].t
    lines: list[Content] = []
    for r in s.retraces:
        step = f"step {units.integer(r.step)}" if r.step is not None else "before the first step"
        lines.append(Content.assemble(
            (f"{units.clock(r.t - origin):>7}  ", "dim"), (r.function, "bold"),
            (f"  trace {r.traces}", ""), (f" of {r.instances} object(s)" if r.instances > 1 else "", "$warning"),
            (f"  {step}", "dim"),
        ))
        lines.append(Content.assemble(("         change    ", "dim"), r.change or "(first trace)"))
        lines.append(Content.assemble(("         signature ", "dim"), r.signature))
    total = len(s.retraces)
    shown_of = max((f.traces for f in s.functions), default=total)
    head = Content.styled(f"{total} trace(s), oldest first"
                          + (" (the oldest dropped)" if shown_of > total else ""), "dim")
    return Content("\n").join([head, Content(""), *lines])


class RetracesScreen(TextScreen):
    def __init__(self, snapshot: RunSnapshot) -> None:
        super().__init__("Retraces", lambda s, w: retraces_text(s, w), snapshot)

"""Goodput: where the run's wall time went, launch to now (or exit), one bucket a line.

Rendered from the snapshot's ledger (:mod:`tpuwatch.monitor.ledger`), the same numbers as the
headless summary and ``tpuwatch report``; a bucket that a current finding explains names it.
"""

from __future__ import annotations

from textual.content import Content

from tpuwatch import units
from tpuwatch.monitor.baseline import ledger_delta
from tpuwatch.monitor.ledger import rows, teardown_lines
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.ui.widgets.panel import Panel

#: Buckets that are time lost, coloured when they take this share of the wall time or more.
LOST = ("above_ideal", "input_wait", "compiling", "stalled", "host", "evaluating", "checkpointing", "iterator",
        "teardown")
WARN_SHARE = 0.25


def goodput_text(s: RunSnapshot, rows_left: int = 10_000, width: int = 80) -> Content:
    """``goodput 3.1% of 1:02`` then one line per bucket: label, seconds, share, a bar, the rule."""
    lg = s.ledger
    if lg is None or lg.wall_s <= 0:
        return Content.styled("no time recorded yet", "dim")
    head = Content.assemble(
        ("goodput ", "bold"),
        (f"{100 * lg.goodput:.1f}%" if lg.goodput is not None else "?", "bold"),
        (f" of {units.clock(lg.wall_s)}", "dim"),
        (f" · ideal step {units.duration(lg.ideal_step_s)}" if lg.ideal_step_s is not None else "", "dim"),
        (f" · vs {s.baseline.label} {d}" if s.baseline is not None and (d := ledger_delta(s)) else "", "dim"),
    )
    lines = [head]
    rules = {f.rule for f in s.findings if f.severity != "info"}
    shown = sorted(rows(lg, rules), key=lambda r: -r.seconds)[: max(0, rows_left - 1)]
    bar_room = max(0, min(20, width - 44))
    # A narrow panel (a third of 120 columns) keeps each bucket's share and drops its seconds,
    # rather than cutting the line.
    narrow = width < 36
    for r in shown:
        style = "$warning" if r.bucket in LOST and r.share >= WARN_SHARE else ""
        bar = "█" * round(bar_room * max(0.0, min(1.0, r.share)))
        label = f"{r.label:<{min(19, max(8, width - 8))}}"[: max(8, width - 8)] if narrow else f"{r.label:<19}"
        lines.append(Content.assemble(
            (label, style), "" if narrow else f"{units.duration(r.seconds):>9} ",
            (f"{100 * r.share:>5.1f}% ", style),
            (f"{bar:<{bar_room}}", "$accent"),
            (f" {d}" if not narrow and (d := ledger_delta(s, r.bucket)) else "", "dim"),
            (f" {r.rule}" if r.rule else "", "$warning")))
    # what a long iterator teardown was, and the line where the iterator was dropped
    room = max(0, rows_left - len(lines))
    notes = teardown_lines(lg.teardowns, top=room, short=True)[:room]
    lines.extend(Content.styled(line, "dim") for line in notes)
    return Content("\n").join(lines)


class GoodputPanel(Panel):
    TITLE = "9 Goodput"  # the number key that jumps here

    def body(self, snapshot: RunSnapshot, rows: int, width: int) -> Content:
        return goodput_text(snapshot, rows, width)

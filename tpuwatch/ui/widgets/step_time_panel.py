"""Step time: current value, p50/p95, a history plot, and input-wait share on the same axis."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import Static

from tpuwatch import units
from tpuwatch.monitor.diagnostics.robust_stats import median
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.ui.widgets.history_bars import BarSeries, HistoryBars
from tpuwatch.ui.widgets.input_panel import WAIT_LEGEND, input_level, input_style, wait_series
from tpuwatch.ui.widgets.panel import Panel


def step_scope(s: RunSnapshot) -> str:
    """``p50/p95: last 200 records`` (empty before the first step)."""
    return f"p50/p95: last {units.integer(s.step_window)} records" if s.step_window else ""


def step_time_text(s: RunSnapshot, width: int = 80) -> Content:
    if s.step_time_s is None:
        return Content.styled("no steps yet", "dim")
    wait = s.input_wait_frac

    def d(x: float | None) -> str:
        return units.duration(x).replace(" ", "")

    # Compact on purpose: the times fit the 36 columns of a panel at 80x24; the wait share
    # is also the label of the wait plot, so it may drop off here.
    line = Content.assemble(
        ("last ", "dim"), (d(s.step_time_s), "bold"),
        (" p50 ", "dim"), d(s.step_p50_s),
        (" p95 ", "dim"), d(s.step_p95_s),
    )
    extra = Content.assemble((" wait ", "dim"), (units.percent(wait), input_style(s)))
    return line + extra if line.cell_length + extra.cell_length <= width else line


#: The first point counts as the compile step when it is this many times the others' median.
COMPILE_RATIO = 3.0


def step_series(s: RunSnapshot, axis: bool = False) -> BarSeries:
    """The step-time plot; ``axis``: steps under its first and last column (expanded: the room)."""
    values = tuple(p.step_time_s for p in s.history)
    finite = [v for v in values if v == v]
    # The first step traces and compiles (often 100x a normal step; in a short run it is also the
    # window's p95): it is left out of the scale and marked, so later steps are not all "▁".
    rest = finite[1:]
    marked: tuple[int, ...] = ()
    if rest and finite[0] > COMPILE_RATIO * median(rest):
        marked = (0,)
        finite = rest
    top = max(finite, default=0.0)
    # Other slow outliers are clipped at 2x p95. Headroom over the median keeps a steady run at
    # two thirds of the height, so a slowdown has somewhere to show.
    p95 = s.step_p95_s if not marked else None
    if p95 and top > 2 * p95:
        top = 2 * p95
    if s.step_p50_s:
        top = max(top, 1.5 * s.step_p50_s)
    steps = (f"step {units.integer(s.history[0].step)}", units.integer(s.history[-1].step)) \
        if axis and s.history else ("", "")
    return BarSeries(values, 0.0, top or 1.0, name="step", top_label=units.duration(top).replace(" ", ""),
                     marked=marked, axis=steps)


def legend(s: RunSnapshot) -> Content:
    """What the glyphs mean (expanded view; also in the help screen)."""
    parts = []
    if step_series(s).marked:
        first = s.history[0]
        parts.append(f"▲ step {units.integer(first.step)} ({units.duration(first.step_time_s)}: tracing and "
                     "compiling) is above the scale")
    parts.append(WAIT_LEGEND)
    return Content.styled(" · ".join(parts), "dim")


class StepTimePanel(Panel):
    TITLE = "1 Step time"  # the number key that jumps here

    def compose(self) -> ComposeResult:
        yield Static(classes="body", markup=False)
        yield HistoryBars(id="step-bars")
        yield HistoryBars(id="wait-bars")

    def body(self, snapshot: RunSnapshot, rows: int, width: int) -> Content:
        if self.has_class("-maximised") and snapshot.history:
            return Content("\n").join([step_time_text(snapshot, width), legend(snapshot)])
        return step_time_text(snapshot, width)

    def state(self, snapshot: RunSnapshot) -> str | None:
        return "-stale" if snapshot.status == "stalled" else None

    def update_extra(self, snapshot: RunSnapshot) -> None:
        # p50/p95 are over the latest records, the report's over the whole run: say which
        self.border_subtitle = step_scope(snapshot)
        self.query_one("#step-bars", HistoryBars).series = step_series(snapshot, self.has_class("-maximised"))
        wait = self.query_one("#wait-bars", HistoryBars)
        wait.series = wait_series(snapshot)  # its scale: in the legend (expanded) and the help
        level = input_level(snapshot)
        wait.set_class(level == "high", "-critical")
        wait.set_class(level == "moderate", "-warning")

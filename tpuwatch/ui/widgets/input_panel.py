"""Input pipeline: how much of each step waits for data, judged by xprof's thresholds."""

from __future__ import annotations

from typing import Literal

from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import Static

from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.ui import units
from tpuwatch.ui.widgets.history_bars import BarSeries, HistoryBars
from tpuwatch.ui.widgets.panel import Panel

#: xprof's input-bound verdict: >= 5% of step time "moderately", >= 20% "highly" input-bound.
MODERATE = 0.05
HIGH = 0.20

WaitLevel = Literal["unknown", "low", "moderate", "high"]


def wait_level(frac: float | None) -> WaitLevel:
    if frac is None or frac != frac:
        return "unknown"
    if frac >= HIGH:
        return "high"
    if frac >= MODERATE:
        return "moderate"
    return "low"


def wait_style(frac: float | None) -> str:
    return {"high": "$error bold", "moderate": "$warning bold", "low": "", "unknown": "dim"}[wait_level(frac)]


_VERDICT = {
    "high": "highly input-bound (≥20%)",
    "moderate": "moderately input-bound (≥5%)",
    "low": "not input-bound (<5%)",
    "unknown": "input wait not measured",
}


def wait_series(s: RunSnapshot) -> BarSeries:
    """Input-wait share of each history point, 0..1 (same buckets as the step-time plot)."""
    values = tuple(
        None if p.input_wait_s is None or p.step_time_s <= 0 else min(1.0, p.input_wait_s / p.step_time_s)
        for p in s.history
    )
    # The bottom label carries the current share: at 80x24 the plot is one row high.
    name = f"w {units.percent(s.input_wait_frac)}" if s.input_wait_frac is not None else "wait"
    return BarSeries(values, 0.0, 1.0, name=name, top_label="100%", reduce="mean")


def input_text(s: RunSnapshot) -> Content:
    frac = s.input_wait_frac
    level = wait_level(frac)
    if s.step_time_s is None:
        return Content.styled("no steps yet", "dim")
    lines = [
        Content.assemble(("wait ", "dim"), (units.percent(frac), wait_style(frac)), ("  of step time", "dim")),
        Content.styled(_VERDICT[level], wait_style(frac) or "dim"),
        Content.assemble(("p50 wait/step ", "dim"), units.duration(s.input_wait_p50_s)),
    ]
    return Content("\n").join(lines)


class InputPanel(Panel):
    TITLE = "Input pipeline"

    def compose(self) -> ComposeResult:
        yield Static(classes="body", markup=False)
        yield HistoryBars(id="input-bars")

    def body(self, snapshot: RunSnapshot, rows: int, width: int) -> Content:
        return input_text(snapshot)

    def state(self, snapshot: RunSnapshot) -> str | None:
        level = wait_level(snapshot.input_wait_frac)
        return {"high": "-critical", "moderate": "-warning"}.get(level)

    def update_extra(self, snapshot: RunSnapshot) -> None:
        self.query_one("#input-bars", HistoryBars).series = wait_series(snapshot)

"""What the dashboard redraws, and when: the pacer's policy (pure), plots that repaint only the
columns that changed, and a header that repaints only the line that changed. Terminal output is
what a viewer over SSH pays for (bench/terminal_bytes.py measures it)."""

from __future__ import annotations

import dataclasses

from textual.app import App, ComposeResult
from textual.geometry import Region
from ui_support import sync

from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.ui.pacer import Pacer
from tpuwatch.ui.widgets.history_bars import BarSeries, HistoryBars
from tpuwatch.ui.widgets.run_header import RunHeader

RUNNING = RunSnapshot(status="running", script="train.py", step=10, started_t=100.0, now=110.0)


def test_numbers_are_shown_once_a_second_and_news_at_once() -> None:
    # The news is what the app passes: the state's version (it counts every change a person must
    # see at once) beside the disk-full note.
    pacer = Pacer(1.0)
    assert pacer.due((1, ""), 0.0)  # the first snapshot always
    assert not pacer.due((1, ""), 0.25)  # only numbers moved
    assert not pacer.due((1, ""), 0.5)
    assert pacer.due((1, ""), 1.0)  # the clock ticks
    assert pacer.due((2, ""), 1.1)  # a finding, a command's progress, the end of the run
    assert not pacer.due((2, ""), 1.2)
    assert pacer.due((2, "disk full"), 1.3)


def test_period_zero_shows_every_snapshot_and_reset_shows_the_next() -> None:
    every = Pacer(0.0)
    assert all(every.due((1, ""), s * 0.01) for s in range(5))
    pacer = Pacer(1.0)
    assert pacer.due((1, ""), 5.0) and not pacer.due((1, ""), 5.1)
    pacer.reset()  # a replay seek
    assert pacer.due((1, ""), 5.2)
    assert pacer.due((1, ""), 1.0)  # a clock that went backwards never freezes the screen


class _Plots(App):
    def compose(self) -> ComposeResult:
        yield HistoryBars(id="plot")
        yield RunHeader(id="header")


def _record_refreshes(widget, log: list) -> None:
    original = widget.refresh

    def refresh(*regions, **kw):
        log.append(regions)
        return original(*regions, **kw)

    widget.refresh = refresh


@sync
async def test_a_plot_repaints_only_the_columns_that_changed() -> None:
    app = _Plots()
    async with app.run_test(size=(47, 8)) as pilot:
        plot = app.query_one(HistoryBars)
        values = tuple(float(1 + i % 5) for i in range(300))
        plot.series = BarSeries(values, 0.0, 10.0, name="step", top_label="10ms")
        await pilot.pause()
        log: list = []
        _record_refreshes(plot, log)
        # One more value that lands in the newest column and raises it to the top.
        plot.series = BarSeries(values + (10.0,), 0.0, 10.0, name="step", top_label="10ms")
        await pilot.pause()
        width, height = plot.size
        assert log == [(Region(width - 1, 0, 1, height),)]
        log.clear()
        plot.series = BarSeries(values + (10.0,), 0.0, 10.0, name="step", top_label="10ms")  # same glyphs
        await pilot.pause()
        assert log == []
        assert str(plot.render()).splitlines()[0].endswith("█")


@sync
async def test_the_header_repaints_only_the_line_that_changed() -> None:
    app = _Plots()
    async with app.run_test(size=(80, 8)) as pilot:
        header = app.query_one(RunHeader)
        header.snapshot = RUNNING
        await pilot.pause()
        log: list = []
        _record_refreshes(header, log)
        header.snapshot = dataclasses.replace(RUNNING, step=11, now=111.0)  # line 2 only
        await pilot.pause()
        assert log == [(Region(0, 1, 80, 1),)]
        log.clear()
        # The badge changes, the progress line does not (elapsed ends where the clock was).
        header.snapshot = dataclasses.replace(RUNNING, step=11, now=111.0, status="finished", ended_t=111.0)
        await pilot.pause()
        assert log == [(Region(0, 0, 80, 1),)]
        assert "FINISHED" in str(header.render())

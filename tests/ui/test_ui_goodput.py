"""The Goodput panel and the header's phase, from one recording-shaped run."""

from __future__ import annotations

import sys
from pathlib import Path

from textual.widgets import Static
from ui_support import FakeClock, screen_text, sync

from tpuwatch.monitor.ledger import LABELS, ledger_of
from tpuwatch.sources.replay_source import ReplaySource
from tpuwatch.ui.app import TpuwatchApp
from tpuwatch.ui.widgets.goodput_panel import goodput_text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "monitor"))
from test_ledger import planted  # noqa: E402  (the ledger's planted timeline)


def _replay() -> ReplaySource:
    src = ReplaySource(planted().msgs, paused=True, clock=FakeClock(0.0))
    src.seek_end()
    return src


def test_goodput_text_fits_80_columns_and_names_each_bucket():
    from tpuwatch.monitor.state import RunState

    tl = planted()
    state = RunState(clock=lambda: tl.t)
    for m in tl.msgs:
        state.apply(m)
    snap = state.snapshot(tl.t)
    text = goodput_text(snap, width=76).plain
    lines = text.splitlines()
    assert all(len(line) <= 76 for line in lines)
    direct = ledger_of(tl.msgs)
    assert lines[0].startswith(f"goodput {100 * direct.goodput:.1f}%")
    for bucket in ("starting", "compiling", "evaluating", "checkpointing", "iterator", "host", "finishing"):
        assert LABELS[bucket] in text


@sync
async def test_goodput_panel_at_80x24_is_key_9_expanded() -> None:
    app = TpuwatchApp(_replay(), refresh_hz=0)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("9")
        await pilot.pause()
        panel = app.query_one("#goodput")
        assert panel.has_class("-maximised") and panel.region.area > 0
        body = str(app.query_one("#goodput > .body", Static).render())
        assert "goodput" in body and "evaluating" in body and "20.00 s" in body
        assert "Goodput" in screen_text(app)


def test_with_a_baseline_the_goodput_panel_says_the_differences():
    # `run --baseline RUN` shows the live deltas in the header and the Goodput panel.
    from tpuwatch.monitor.baseline import Baseline
    from tpuwatch.monitor.state import RunState

    tl = planted()
    state = RunState(clock=lambda: tl.t)
    state.baseline = Baseline(run_id="20250615-120000-train-ab12", step_p50_s=None, steps_per_s=None,
                              examples_per_s=None, input_wait_share=None, goodput=0.5,
                              ledger_shares={"evaluating": 0.0, "starting": 0.01})
    for m in tl.msgs:
        state.apply(m)
    snap = state.snapshot(tl.t)
    lg = snap.ledger
    text = goodput_text(snap, width=100).plain
    lines = text.splitlines()
    assert f"vs ab12 {100 * (lg.goodput - 0.5):+.0f} pt" in lines[0]
    (evaluating,) = [ln for ln in lines if ln.startswith(LABELS["evaluating"])]
    assert f"{100 * lg.share('evaluating'):+.0f} pt" in evaluating
    # without a baseline, no deltas
    state.baseline = None
    assert " pt" not in goodput_text(state.snapshot(tl.t), width=100).plain


def test_a_long_iterator_teardown_has_its_row_and_a_line_saying_where():
    from test_ledger import epochs_with_a_pause

    from tpuwatch.monitor.state import RunState

    tl = epochs_with_a_pause(19.5)
    state = RunState(clock=lambda: tl.t)
    state.apply_all(tl.msgs)
    lines = goodput_text(state.snapshot(tl.t), width=100).plain.splitlines()
    (row,) = [ln for ln in lines if ln.startswith(LABELS["teardown"])]
    assert "19.50 s" in row
    assert lines[-1] == "  19.50 s after step 50, 0% CPU: tf.data iterator deleted at t.py:48"
    # with no room left for it, the line goes first
    short = goodput_text(state.snapshot(tl.t), rows_left=3, width=100).plain.splitlines()
    assert len(short) == 3 and not short[-1].startswith("  ")

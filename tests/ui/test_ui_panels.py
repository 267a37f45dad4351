"""Panel behaviour from issue 13: loss colour from findings only (item 4), the labelled step-time
headline and the compile step kept out of the chart's scale (item 6)."""

from __future__ import annotations

from dataclasses import replace

from tpuwatch.monitor.snapshot import RunSnapshot, StepPoint
from tpuwatch.protocol import Finding, Step
from tpuwatch.ui.widgets.replica_loss_panel import loss_state, replica_loss_text
from tpuwatch.ui.widgets.step_time_panel import step_series, step_time_text

from ui_support import screen_text, sync


def _skewed_step(step: int, t: float) -> Step:
    # One replica 15% above the others on a single step, near zero loss: noise, not a finding.
    return Step(step=step, t=t, step_time_s=0.05, input_wait_s=0.001, loss=0.0215,
                replica_losses=(0.020, 0.020, 0.020, 0.026), steps=1, examples=64, function="train_step")


@sync
async def test_one_noisy_step_does_not_colour_the_loss_panel(live_app) -> None:
    app = live_app(upto=200)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        app._state.apply(_skewed_step(10_000, app.snapshot.now))
        app.pull()
        await pilot.pause()
        assert app.snapshot.replica_losses[3].loss == 0.026
        loss = app.query_one("#loss")
        assert not loss.has_class("-warning") and not loss.has_class("-critical")
        assert "◀" not in screen_text(app)


@sync
async def test_the_skew_finding_colours_the_panel_and_marks_its_replica(live_app) -> None:
    app = live_app(upto=200)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        t = app.snapshot.now
        app._state.apply(Finding(t=t, rule="replica-loss-skew", severity="warning",
                                 message="replica 3 loss is 30% higher", advice="check the sharding",
                                 evidence={"replica": 3}))
        app.pull()
        await pilot.pause()
        assert app.query_one("#loss").has_class("-warning")
        row = next(line for line in screen_text(app).splitlines() if "r3" in line)
        assert "◀" in row


def test_loss_state_is_the_most_severe_loss_finding() -> None:
    f = Finding(t=0, rule="replica-loss-skew", severity="warning", message="", advice="")
    nf = replace(f, rule="loss-nonfinite", severity="critical")
    other = replace(f, rule="input-bound", severity="critical")
    assert loss_state(RunSnapshot(findings=(other,))) is None
    assert loss_state(RunSnapshot(findings=(f,))) == "-warning"
    assert loss_state(RunSnapshot(findings=(f, nf))) == "-critical"
    assert "no losses yet" in replica_loss_text(RunSnapshot(), 5).plain


def test_step_time_headline_is_labelled() -> None:
    s = RunSnapshot(step_time_s=0.213, step_p50_s=0.0185, step_p95_s=0.119, input_wait_frac=0.02)
    text = step_time_text(s, 80).plain
    assert text.startswith("last 213ms")  # the last step, not to be read as the p50
    assert "p50 18.5ms" in text and "p95 119ms" in text


def test_compile_step_is_kept_out_of_the_scale_and_marked() -> None:
    history = (StepPoint(step=1, t=0, step_time_s=2.0, input_wait_s=None, loss=None),) + tuple(
        StepPoint(step=i, t=i, step_time_s=0.02, input_wait_s=None, loss=None) for i in range(2, 10))
    # A short run: the compile step is also the p95 of the window.
    s = RunSnapshot(history=history, step_p50_s=0.02, step_p95_s=2.0, step_time_s=0.02)
    series = step_series(s)
    assert series.hi < 0.1  # scaled to the steady steps, not to the 2 s compile
    assert series.marked == (0,)  # the first point is marked as the compile step

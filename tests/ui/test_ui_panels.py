"""Panel behaviour: loss colour from findings only, the labelled step-time
headline and the compile step kept out of the chart's scale."""

from __future__ import annotations

from dataclasses import replace

from ui_support import screen_text, sync

from tpuwatch.monitor.snapshot import RunSnapshot, StepPoint
from tpuwatch.protocol import Finding, Step
from tpuwatch.ui.widgets.replica_loss_panel import loss_state, replica_loss_text
from tpuwatch.ui.widgets.step_time_panel import step_series, step_time_text


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


# --- a focused panel expands and scrolls; the retraces panel lists every trace; findings scroll ----------

def _many_findings(t: float) -> list[Finding]:
    return [Finding(t=t + i, rule=f"rule-{i}", severity="warning", message=f"problem number {i} " + "x" * 60,
                    advice=f"advice number {i}: " + "do this and that " * 6) for i in range(12)]


@sync
async def test_findings_expand_with_z_and_show_every_line(live_app) -> None:
    app = live_app(upto=200)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        for f in _many_findings(app.snapshot.now):
            app._state.add_finding(f)
        app.pull()
        await pilot.pause()
        text = screen_text(app)
        assert "more: z expands" in text  # cut, and says so
        await pilot.press("4", "z")
        await pilot.pause()
        findings = app.query_one("#findings")
        assert findings.has_class("-maximised") and app.screen.has_class("-panel-max")
        assert not app.query_one("#step-time").display or not app.query_one("#step-time").region.area
        body = str(findings.query_one(".body").render())
        assert "problem number 11" in body and "more: z expands" not in body
        assert findings.max_scroll_y > 0  # longer than the screen: it scrolls
        await pilot.press("pagedown")
        assert findings.scroll_y > 0
        await pilot.press("enter")
        await pilot.pause()
        assert not findings.has_class("-maximised") and not app.screen.has_class("-panel-max")


@sync
async def test_enter_on_retraces_lists_every_retrace_with_its_step_and_whole_change(live_app) -> None:
    app = live_app(upto=300)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        await pilot.press("6", "enter")
        await pilot.pause()
        assert app.query_one("#retraces").has_class("-maximised")
        text = screen_text(app)
        assert "2 trace(s), oldest first" in text
        assert "x: shape (16, 28, 28, 1) -> (8, 28, 28, 1)" in text and "step 99" in text
        assert "(x: float32[8, 28, 28, 1], y: int64[8])" in text
        await pilot.press("escape")
        assert not app.query(".-maximised")


def test_retrace_names_are_not_cut_to_8_characters() -> None:
    from tpuwatch.monitor.snapshot import FunctionTraces
    from tpuwatch.ui.widgets.retrace_panel import retrace_text

    s = RunSnapshot(functions=(FunctionTraces(name="multi_step_on_iterator", traces=3, instances=1,
                                              last_change="x: shape", last_signature="", last_step=5, t=0),))
    assert "multi_step_on_iterator" in retrace_text(s, 5, 60).plain


@sync
async def test_number_key_of_a_panel_hidden_at_80x24_shows_it_expanded(live_app) -> None:
    app = live_app(upto=300)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert not app.query_one("#events").display  # no room for it at 80x24
        await pilot.press("7")
        await pilot.pause()
        events = app.query_one("#events")
        assert events.has_class("-maximised") and events.region.area > 0
        assert "started on tpu-vm-0" in screen_text(app)
        await pilot.press("6")
        await pilot.pause()
        assert app.query_one("#retraces").has_class("-maximised")
        await pilot.press("escape", "1")
        assert not app.query(".-maximised") and app.focused is app.query_one("#step-time")


# --- the loss chart stays readable after convergence ------------------------------------

def _converged_history() -> tuple[StepPoint, ...]:
    # 2.3 falling to ~0.02, then small wiggles: the whole run's linear scale flattens the end.
    import math as m

    return tuple(StepPoint(step=i, t=i, step_time_s=0.02, input_wait_s=None,
                           loss=2.3 * m.exp(-i / 30) + 0.02 + 0.004 * m.sin(i / 3)) for i in range(1, 1001))


def _recent_glyphs(scale: str) -> set[str]:
    from tpuwatch.ui.widgets.history_bars import GUTTER, render_series
    from tpuwatch.ui.widgets.replica_loss_panel import loss_series

    rows = render_series(loss_series(RunSnapshot(history=_converged_history()), scale), 7 + 40, 5).plain.split("\n")
    return {row[GUTTER:][-20:] for row in rows[:-1]}  # the last 20 columns of each bar row


def test_loss_chart_after_convergence_recent_and_log_scales_still_move() -> None:
    # Whole run, linear: the last 20 columns are one flat row of the lowest glyph.
    flat = _recent_glyphs("run")
    assert all(set(r) <= {" ", "▁"} for r in flat), flat
    # Recent window: scaled to its own min..max, the wiggles use the whole height.
    assert len(set("".join(_recent_glyphs("recent"))) - {" "}) >= 4
    # Log scale: the whole descent stays in view and the plateau still moves.
    assert len(set("".join(_recent_glyphs("log"))) - {" "}) >= 2


def test_loss_chart_labels_min_max_and_steps() -> None:
    from tpuwatch.ui.widgets.history_bars import render_series
    from tpuwatch.ui.widgets.replica_loss_panel import loss_series

    text = render_series(loss_series(RunSnapshot(history=_converged_history()), "run"), 60, 5).plain
    lines = text.split("\n")
    assert lines[0].strip().startswith("2.2")  # max at the top
    assert lines[-2].strip().startswith("0.01")  # min at the bottom
    assert lines[-1].strip().startswith("step 1") and lines[-1].rstrip().endswith("1,000")


@sync
async def test_l_switches_the_loss_scale_and_epoch_logs_show(live_app) -> None:
    from tpuwatch.protocol import Epoch

    app = live_app(upto=300)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        loss = app.query_one("#loss")
        assert str(loss.border_subtitle).startswith("recent")
        await pilot.press("l")
        assert str(loss.border_subtitle).startswith("log scale")
        await pilot.press("l")
        assert str(loss.border_subtitle).startswith("whole run")
        app._state.apply(Epoch(t=app.snapshot.now, epoch=1, phase="end", step=200,
                               logs={"loss": 0.5, "val_loss": 0.61, "sparse_categorical_accuracy": 0.83,
                                     "learning_rate": 0.001}))
        app.pull()
        await pilot.pause()
        assert "epoch 2: val_loss 0.61 · lr 0.001 · acc 0.83" in screen_text(app)


@sync
async def test_enter_in_the_quit_dialog_is_the_dialogs_not_expand(live_app) -> None:
    from tpuwatch.ui.screens.quit_screen import QuitScreen

    app = live_app(upto=200)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("4", "q")
        assert isinstance(app.screen, QuitScreen)
        await pilot.press("enter")  # cancel has the focus
        await pilot.pause()
        assert not isinstance(app.screen, QuitScreen) and app.return_value is None
        assert not app.query_one("#findings").has_class("-maximised")


def test_expanded_loss_panel_lists_every_epochs_keras_logs() -> None:
    from tpuwatch.monitor.snapshot import ReplicaLoss
    from tpuwatch.ui.widgets.panel import EXPANDED_ROWS
    from tpuwatch.ui.widgets.replica_loss_panel import replica_loss_text

    s = RunSnapshot(loss=0.4, epoch_logs=((0, {"loss": 1.2, "val_loss": 1.3}), (1, {"loss": 0.7, "val_loss": 0.9})),
                    replica_losses=(ReplicaLoss(index=0, device="CPU:0", worker="w", loss=0.4, deviation=0.0,
                                                finite=True, step=9),))
    text = replica_loss_text(s, EXPANDED_ROWS).plain
    assert "epoch      loss  val_loss" in text
    assert "    1       1.2       1.3" in text and "    2       0.7       0.9" in text
    assert "epoch      loss" not in replica_loss_text(s, 8).plain  # only when expanded


@sync
async def test_findings_at_80x24_show_the_worst_headline_and_count_findings(live_app) -> None:
    # A crashed run: two critical findings and the raw error. The 4-row panel used to show the
    # raw error's first line and "… 4 more" (lines); the diagnosis must be visible, and the
    # count is of findings.
    app = live_app("crashed", upto=10_000)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        body = str(app.query_one("#findings").query_one(".body").render())
        assert body.startswith("!! script crashed:")
        assert body.rstrip().endswith("… 2 more: z expands")
        assert "!! crashed: FloatingPointError" not in body  # the diagnosis comes first

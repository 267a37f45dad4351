"""One input-wait definition, one verdict, the same numbers everywhere: the finding,
the snapshot every panel reads, the headless lines and the report all quote the engine's share."""

from __future__ import annotations

from diag_synthetic import SyntheticRun

from tpuwatch.console.headless import progress_line, summary
from tpuwatch.monitor.diagnostics.feed import FindingsFeed
from tpuwatch.monitor.state import RunState


def _fed(run: SyntheticRun) -> tuple[RunState, FindingsFeed]:
    state, feed = RunState(), FindingsFeed(clock=lambda: run.t)
    for msg, worker in run.msgs:
        state.apply(msg)
        feed.apply(msg, worker)
    feed.evaluate(state, run.t, force=True)
    return state, feed


def test_finding_snapshot_headless_agree():
    run = SyntheticRun(step_time_s=0.031, time_noise=0.0)
    run.steps(5, step_time_s=2.0)  # tracing: not eligible, and would drag a plain average
    run.steps(115, input_wait_s=lambda s, w: 0.66 * 0.031)
    run.exit(0)
    state, feed = _fed(run)
    (f,) = [f for f in feed.engine.findings() if f.rule == "input-bound"]
    snap = state.snapshot(now=run.t)
    assert snap.input_run is not None and snap.input_run.level == "high"
    assert round(100 * snap.input_run.share) == f.evidence["input_wait_pct"] == 66
    assert snap.input_run.steps == f.evidence["window_steps"] == 114
    assert round(100 * snap.input_wait_frac_total) == round(100 * snap.input_wait_frac) == 66
    assert "input 66%" in progress_line(snap)
    assert "66% of step time waiting for input (20 ms of 31 ms per step, 114 steps): highly input-bound" in summary(snap)


def test_fast_input_bound_steps_are_input_bound_everywhere():
    # s10_input_truth.py: 3.8 ms of a 5.5 ms step waits for input (the script measured 69 %):
    # the finding, the snapshot the Input panel reads and the headless summary all say so
    run = SyntheticRun(step_time_s=0.0055, time_noise=0.0)
    run.steps(5, step_time_s=2.0)
    run.steps(200, input_wait_s=lambda s, w: 0.69 * 0.0055)
    run.exit(0)
    state, feed = _fed(run)
    (f,) = [f for f in feed.engine.findings() if f.rule == "input-bound"]
    assert f.severity == "warning" and f.evidence["input_wait_pct"] == 69
    snap = state.snapshot(now=run.t)
    assert snap.input_recent.level == snap.input_run.level == "high"
    assert "69% of step time waiting for input (3.8 ms of 5.5 ms per step, 199 steps): highly input-bound" in summary(snap)


def test_microsecond_wait_is_not_input_bound_anywhere():
    # 25 % of a 0.2 ms step is 50 us: below the 0.1 ms floor, noise
    run = SyntheticRun(step_time_s=0.0002, time_noise=0.0)
    run.steps(5, step_time_s=2.0)
    run.steps(200, input_wait_s=lambda s, w: 0.25 * 0.0002)
    state, feed = _fed(run)
    assert [f for f in feed.engine.findings() if f.rule == "input-bound"] == []
    snap = state.snapshot(now=run.t)
    assert snap.input_recent.level == "low" and round(100 * snap.input_recent.share) == 25


def test_a_finished_run_shows_the_findings_whole_run_figure_in_every_view():
    # On the finished keras_fit sample the finding said 32% (whole run) while the
    # Input panel said 43% (its last window) and the Workers panel a third, rolling figure.
    from tpuwatch.ui.widgets.input_panel import input_text

    run = SyntheticRun(step_time_s=0.1, time_noise=0.0)
    run.steps(5, step_time_s=2.0)
    run.steps(400, input_wait_s=lambda s, w: 0.2 * 0.1)
    run.steps(300, step_time_s=0.15, input_wait_s=lambda s, w: 0.5 * 0.15)  # the last window: 50%
    run.exit(0)
    state, feed = _fed(run)
    (f,) = [f for f in feed.engine.findings() if f.rule == "input-bound"]
    pct = f.evidence["input_wait_pct"]
    assert f.evidence["scope"] == "over the whole run" and pct == 36
    snap = state.snapshot(now=run.t)
    assert snap.input_scope == "over the whole run" and round(100 * snap.input_wait_frac) == pct
    panel = input_text(snap).plain
    assert f"wait {pct}%" in panel and "over the whole run" in panel
    (w,) = snap.workers
    assert round(100 * w.input_wait_frac) == pct and w.input_scope == "over the whole run"
    assert f"input {pct}%" in progress_line(snap)
    assert f"{pct}% of step time waiting for input" in summary(snap)


def test_a_finding_about_one_worker_of_several_names_it_in_its_message_and_its_row():
    # Three MultiWorkerMirroredStrategy workers, one starved: the merged summary said
    # "input 18%" and the finding "highly input-bound: 50% of step time" without naming whose.
    from tpuwatch.ui.widgets.workers_panel import workers_text

    run = SyntheticRun(step_time_s=0.1, time_noise=0.0, workers=3)
    run.steps(5, step_time_s=2.0)
    run.steps(200, input_wait_s=lambda s, w: 0.05 if w == 2 else 0.001)
    run.exit(0)
    state = RunState()
    feed = FindingsFeed(clock=lambda: run.t)
    for msg, worker in run.msgs:
        state.apply(msg, worker)
        feed.apply(msg, worker)
    feed.evaluate(state, run.t, force=True)
    starved = run.names[2]
    (f,) = [f for f in feed.engine.findings() if f.rule == "input-bound"]
    assert f.worker == starved and f.message.startswith(f"{starved}: highly input-bound: 50%")
    snap = state.snapshot(now=run.t)
    rows = {line.split()[0]: line for line in workers_text(snap, 10, 120).plain.splitlines()}
    assert "input-bound" in rows[starved[:12]] and "in  50%" in rows[starved[:12]]
    assert all("input-bound" not in rows[n[:12]] for n in run.names[:2])
    assert round(100 * snap.input_wait_frac) < 50  # the merged figure speaks for all three

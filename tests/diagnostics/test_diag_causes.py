"""A finding's steps are where its condition held; one cause, one finding."""

import math

import pytest
from diag_synthetic import SyntheticRun, findings


def test_input_bound_range_begins_where_the_wait_rose():
    # keras_fit.py's shape: a healthy pipeline until step 600, then 150 ms of input wait a step
    run = SyntheticRun(step_time_s=0.05)
    run.steps(599)
    run.steps(900, step_time_s=0.2, input_wait_s=0.15)
    run.exit()
    (f,) = findings(run.engine(), "input-bound")
    assert 595 <= f.first_step <= 610, f
    assert f.last_step == 1499


def test_input_bound_from_the_start_begins_at_the_first_judged_step():
    run = SyntheticRun(step_time_s=0.05)
    run.steps(400, input_wait_s=0.03)
    run.exit()
    (f,) = findings(run.engine(), "input-bound")
    assert f.first_step <= 10, f


def test_a_loss_that_goes_inf_on_every_replica_at_once_is_said_once():
    run = SyntheticRun(step_time_s=0.05)
    run.steps(40, loss=lambda s, r, v: math.inf if s >= 23 else v)
    (f,) = findings(run.engine(), "loss-nonfinite")
    assert "inf on all 4 replicas from step 23" in f.message, f.message
    assert "later also" not in f.message and f.evidence["replica"] == "all"


def test_a_replica_that_goes_bad_first_is_still_named():
    run = SyntheticRun(step_time_s=0.05)
    run.steps(40, loss=lambda s, r, v: math.inf if (s >= 23 and r == 2) or s >= 30 else v)
    (f,) = findings(run.engine(), "loss-nonfinite")
    assert "replica 2" in f.message and "later also replicas 0, 1, 3" in f.message, f.message


def test_a_step_time_rise_from_input_wait_is_evidence_of_input_bound():
    # the same slowdown: 75 ms steps, then 150 ms of which 75 ms wait for input
    run = SyntheticRun(step_time_s=0.075)
    run.steps(600)
    run.steps(600, step_time_s=0.15, input_wait_s=0.075)
    eng = run.engine()
    assert findings(eng, "step-time-jitter") == []
    (f,) = findings(eng, "input-bound")
    assert "(2.0x), from the input wait" in f.evidence["step_time_rise"], f.evidence


def test_a_step_time_rise_without_input_wait_stays_its_own_finding():
    run = SyntheticRun(step_time_s=0.075)
    run.steps(600)
    run.steps(600, step_time_s=0.15)
    assert any("rising" in f.message for f in findings(run.engine(), "step-time-jitter"))


def test_a_spread_folded_into_input_bound_later_is_gone_from_the_run_state():
    # the README sample (keras_fit.py, 2026-11-26): fast steps, then from step 600 a wait of
    # ~140 ms a step. Around step 680 the window's spread (p95 150 ms vs median 11 ms) was a
    # finding of its own, the wait not yet enough to explain it; once it was, the engine folded
    # it into input-bound, but the run state (the report, the panel, the headless summary) kept
    # the stale "p95 152 ms is 14x the median 11 ms" beside it
    from tpuwatch.monitor.diagnostics.feed import FindingsFeed
    from tpuwatch.monitor.state import RunState

    run = SyntheticRun(step_time_s=0.011)
    state = RunState()
    feed = FindingsFeed(clock=lambda: run.t, every_s=1.0, state=state)
    seen_alone = False

    def play() -> None:
        nonlocal seen_alone
        for msg, _ in run.msgs:
            state.apply(msg)
            feed.apply(msg)
            if msg.t is not None:
                feed.evaluate(state, msg.t)
        run.msgs = []
        seen_alone |= any(f.rule == "step-time-jitter" for f in state.snapshot(run.t).findings)

    run.steps(600)
    play()
    for _ in range(90):
        run.steps(10, step_time_s=0.151, input_wait_s=0.14)
        play()
    run.exit()
    play()
    feed.evaluate(state, run.t + 0.1, force=True)
    assert seen_alone  # the shape of the bug: the spread stood alone for a while
    rules = [f.rule for f in state.snapshot(run.t).findings]
    assert "step-time-jitter" not in rules and "input-bound" in rules, rules
    (f,) = [f for f in state.snapshot(run.t).findings if f.rule == "input-bound"]
    # the folded figure says which steps it is about (the run's p50 is 151 ms)
    assert f.evidence["step_time_spread"].startswith("steps "), f.evidence


def test_the_input_bound_wait_per_step_is_the_ledgers_when_reads_skip_steps():
    # one quantity, one figure: the README sample's finding said "mean 87 ms of 99 ms per step"
    # over the 704 steps whose wait was read (all of the fast first 256, then every other one)
    # while its ledger booked 126 s of wait over 1,500 steps (84 ms a step)
    from tpuwatch.monitor.ledger import ledger_of

    run = SyntheticRun(step_time_s=0.011)
    run.steps(300, input_wait_s=0.0001)
    run.steps(600, step_time_s=0.151, input_wait_s=lambda s, w: 0.14 if s % 2 else None)
    run.exit()
    msgs = [m for m, _ in run.msgs]
    eng = run.engine()
    (f,) = findings(eng, "input-bound")
    lg = ledger_of(msgs)
    per_step_ms = 1000 * lg.buckets["input_wait"] / lg.steps
    assert f.evidence["input_wait_ms_per_step"] == pytest.approx(per_step_ms, rel=0.03), (f.evidence, per_step_ms)


@pytest.mark.parametrize("tail", [300, 5000], ids=["unread-at-exit", "more-unread-than-kept"])
def test_steps_whose_wait_was_never_read_count_the_same_in_the_finding_and_the_ledger(tail):
    # the run ends before the agent reads the wait again (it reads at most every 0.25 s): the
    # ledger booked those steps at the last read's wait and the finding left them out (70 ms a
    # step against the ledger's 93); past the bound of steps kept waiting for a read, the
    # finding dropped them and the ledger booked them
    from tpuwatch.monitor.ledger import ledger_of

    run = SyntheticRun(step_time_s=0.011)
    run.steps(300, input_wait_s=0.0001)
    run.steps(300, step_time_s=0.151, input_wait_s=0.14)
    run.steps(tail, step_time_s=0.151, input_wait_s=lambda s, w: None)
    run.exit()
    lg = ledger_of([m for m, _ in run.msgs])
    (f,) = findings(run.engine(), "input-bound")
    per_step_ms = 1000 * lg.buckets["input_wait"] / lg.steps
    assert f.evidence["input_wait_ms_per_step"] == pytest.approx(per_step_ms, rel=0.03), (f.evidence, per_step_ms)


def test_a_run_whose_wait_is_never_read_has_no_input_share_past_the_bound_of_steps_held():
    # no tf.data input: no record carries a wait; past the 4,096 held for a read, the records
    # must not count as measured waits of 0 (the panel says "wait not measured")
    run = SyntheticRun(step_time_s=0.011)
    run.steps(5000, input_wait_s=lambda s, w: None)
    run.exit()
    eng = run.engine()
    assert findings(eng, "input-bound") == []
    assert eng.input_figures().run is None and eng.input_figures().shown is None


def _slowdown(run: SyntheticRun, first: int, n: int, slow_s: float, normal_s: float) -> None:
    from tpuwatch.protocol import SlowSteps
    run.emit(SlowSteps(t=run.t, path="/r/profiles/p", function="train_step", first_slow_step=first,
                       step_from=first + 8, step_to=first + 13, slow_step_s=slow_s, normal_step_s=normal_s))


def test_a_spread_that_a_captured_slowdown_accounts_for_is_evidence_of_slow_steps():
    # slow_steps.py's shape: 30 of 260 steps 10x slower put the p95 inside the slowdown: it was
    # said twice, as slow-steps and as step-time-jitter
    run = SyntheticRun(step_time_s=0.016)
    run.steps(150)
    run.steps(30, step_time_s=0.18)
    _slowdown(run, 151, 30, 0.18, 0.016)
    run.steps(80)
    eng = run.engine()
    assert findings(eng, "step-time-jitter") == []
    (f,) = findings(eng, "slow-steps")
    assert "from the slowdown" in f.evidence["step_time_spread"], f.evidence


def test_a_spread_beside_a_slowdown_that_does_not_account_for_it_stays_its_own_finding():
    # a slowdown to 40 ms, but the spread's p95 is the 300 ms steps elsewhere
    run = SyntheticRun(step_time_s=0.016)
    run.steps(100)
    run.steps(30, step_time_s=0.05)
    _slowdown(run, 101, 30, 0.05, 0.016)
    for _ in range(13):
        run.steps(9)
        run.steps(1, step_time_s=0.3)
    eng = run.engine()
    assert findings(eng, "step-time-jitter"), [f.rule for f in findings(eng)]

"""input-bound: xprof's 5 % / 20 % of step time, with an absolute floor and minimum evidence."""

from diag_synthetic import SyntheticRun, findings


def run_with_wait(frac: float, step_time_s: float = 0.2, n: int = 200) -> SyntheticRun:
    run = SyntheticRun(step_time_s=step_time_s, time_noise=0.0)
    run.steps(5, step_time_s=2.0)  # warm-up: tracing
    run.steps(n, input_wait_s=lambda s, w: frac * step_time_s)
    return run


def test_just_below_info_is_silent():
    assert findings(run_with_wait(0.045).engine(), "input-bound") == []


def test_just_above_info_fires_info():
    (f,) = findings(run_with_wait(0.055).engine(), "input-bound")
    assert f.severity == "info"
    assert f.evidence["input_wait_pct"] in (5, 6)
    assert f.worker == "host0:100"
    assert "prefetch" in f.advice and "AUTOTUNE" in f.advice and "interleave" in f.advice
    assert "tf.data service" in f.advice or "tf.data.experimental.service" in f.advice


def test_just_below_warning_is_info_and_above_is_warning():
    (f,) = findings(run_with_wait(0.19).engine(), "input-bound")
    assert f.severity == "info"
    (f,) = findings(run_with_wait(0.21).engine(), "input-bound")
    assert f.severity == "warning"
    assert f.evidence["input_wait_pct"] == 21
    assert f.first_step is not None and f.last_step == 205


def test_small_absolute_wait_is_not_starvation():
    # 30 % of a 10 ms step is 3 ms: what an eager distributed fetch costs even when fast
    assert findings(run_with_wait(0.30, step_time_s=0.01, n=800).engine(), "input-bound") == []


def test_too_little_evidence_is_silent():
    # 20 eligible records at 80 %, the worst left out: 19 steps, below the 20-step minimum
    assert findings(run_with_wait(0.8, n=20).engine(), "input-bound") == []


def test_twenty_steps_are_enough_whatever_their_seconds():
    # 21 records of 31 ms (0.65 s of step time in all): 20 steps judged, 66 % waiting
    (f,) = findings(run_with_wait(0.66, step_time_s=0.031, n=21).engine(), "input-bound")
    assert f.severity == "warning"
    assert f.evidence["input_wait_pct"] == 66 and f.evidence["window_steps"] == 20


def test_a_finished_run_is_judged_over_all_its_steps():
    # 2,000 records: the live window holds the latest 1,024; once the run ended the finding
    # speaks for every eligible step (the worst left out)
    run = SyntheticRun(step_time_s=0.05, time_noise=0.0)
    run.steps(5, step_time_s=2.0)
    run.steps(2000, input_wait_s=lambda s, w: 0.3 * 0.05)
    eng = run.engine()
    (live,) = findings(eng, "input-bound")
    assert live.evidence["scope"] == "over the latest steps" and live.evidence["window_steps"] == 1023
    run.exit(0)
    run.feed(eng)
    (f,) = findings(eng, "input-bound")
    assert f.evidence["scope"] == "over the whole run"
    assert f.evidence["input_wait_pct"] == 30 and f.evidence["window_steps"] == 1999
    assert (f.first_step, f.last_step) == (6, 2005)


def test_one_slow_iterator_start_per_epoch_does_not_fire():
    run = SyntheticRun(step_time_s=0.1, time_noise=0.05)
    run.steps(5, step_time_s=2.0)
    for epoch in range(3):
        run.epoch_begin(epoch)
        # the new iterator fills a 10k-element shuffle buffer: one 3 s wait
        run.steps(1, step_time_s=3.1, input_wait_s=3.0, epoch=epoch)
        run.steps(150, epoch=epoch)
        run.epoch_end(epoch)
    assert findings(run.engine(), "input-bound") == []


def test_episode_in_the_middle_survives_a_replay_report():
    # input-bound for 600 steps, then fine for 2000: the report (one evaluate at the end)
    # still names it, because windows are checked while the replay is applied
    run = SyntheticRun(step_time_s=0.1, time_noise=0.05)
    run.steps(5, step_time_s=2.0)
    run.steps(600, input_wait_s=lambda s, w: 0.05)
    run.steps(2000)
    (f,) = findings(run.engine(), "input-bound")
    assert f.severity == "warning"
    # the episode's bounds are the bounds of the windows that were input-bound
    assert f.first_step <= 605 and f.last_step < 2000

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


def test_fast_steps_waiting_most_of_their_time_are_input_bound():
    # the tester's s10_input_truth.py: a 4 ms sleep per batch, the script's own timing 3.79 ms
    # fetch vs 1.73 ms compute; fast steps are typical on a TPU, the share is what matters
    (f,) = findings(run_with_wait(0.69, step_time_s=0.0055, n=200).engine(), "input-bound")
    assert f.severity == "warning" and f.evidence["input_wait_pct"] == 69
    assert f.message.startswith("highly input-bound: 69% of step time waiting for input")
    # 30 % of a 10 ms step (an eager distributed fetch of 3 ms) is time the step waits too
    (f,) = findings(run_with_wait(0.30, step_time_s=0.01, n=800).engine(), "input-bound")
    assert f.severity == "warning"


def test_microsecond_waits_are_noise_not_starvation():
    # 25 % of a 0.2 ms step is 50 us per step: timer and scheduling noise, not worth a finding
    assert findings(run_with_wait(0.25, step_time_s=0.0002, n=800).engine(), "input-bound") == []


def test_too_little_evidence_is_silent():
    # 20 eligible records at 80 %, the worst left out: 19 steps, below the 20-step minimum
    assert findings(run_with_wait(0.8, n=20).engine(), "input-bound") == []


def test_twenty_steps_are_enough_whatever_their_seconds():
    # 21 records of 31 ms (0.65 s of step time in all): 20 steps judged, 66 % waiting
    (f,) = findings(run_with_wait(0.66, step_time_s=0.031, n=21).engine(), "input-bound")
    assert f.severity == "warning"
    assert f.evidence["input_wait_pct"] == 66 and f.evidence["window_steps"] == 20


def test_a_finished_run_is_judged_over_all_its_steps():
    # 2,000 records of 50 ms: the live window holds the last 30 s; once the run ended the
    # finding speaks for every eligible step (the worst left out)
    run = SyntheticRun(step_time_s=0.05, time_noise=0.0)
    run.steps(5, step_time_s=2.0)
    run.steps(2000, input_wait_s=lambda s, w: 0.3 * 0.05)
    eng = run.engine()
    (live,) = findings(eng, "input-bound")
    assert live.evidence["scope"] == "over the last 30 s" and live.evidence["window_steps"] == 600
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


def test_live_verdict_speaks_for_the_last_30_seconds():
    # the sample keras_fit run: a slowdown at step 600, after which the steps wait 36 % for
    # input; the live finding must say so, not average it with the 600 steps before
    run = SyntheticRun(step_time_s=0.1, time_noise=0.0)
    run.steps(5, step_time_s=2.0)
    run.steps(595, input_wait_s=lambda s, w: 0.03 * 0.1)
    run.steps(400, step_time_s=0.15, input_wait_s=lambda s, w: 0.36 * 0.15)
    eng = run.engine()
    (f,) = findings(eng, "input-bound")
    assert f.severity == "warning" and f.evidence["input_wait_pct"] == 36
    assert f.evidence["scope"] == "over the last 30 s"
    # sticky: first_step is where a 30 s window first saw the slowdown, not the run's start
    assert 190 <= f.evidence["window_steps"] <= 201 and f.first_step > 500
    # the figures are means over that window, and the message says so
    assert f.message == ("highly input-bound: 36% of step time waiting for input "
                         "(mean 54 ms of 150 ms per step over the last 30 s)")
    fig = eng.input_figures()
    recent, run_share = fig.recent, fig.run
    assert round(100 * recent.share) == 36 and recent.first_step > 800
    assert run_share.steps > 900
    # what every view shows is the finding's own figure and scope
    assert fig.shown == recent and fig.scope == "over the last 30 s"
    assert fig.workers == ((fig.workers[0][0], recent, "over the last 30 s"),)


def test_fast_steps_window_is_the_latest_records_and_says_so():
    # 10 ms steps: 30 s would be 3,000 records; the window holds the latest 1,024
    run = SyntheticRun(step_time_s=0.01, time_noise=0.0)
    run.steps(5, step_time_s=2.0)
    run.steps(2000, input_wait_s=lambda s, w: 0.3 * 0.01)
    (f,) = findings(run.engine(), "input-bound")
    assert f.evidence["scope"] == "over the last 1,024 steps" and f.evidence["window_steps"] == 1023
    assert f.message.endswith("(mean 3 ms of 10 ms per step over the last 1,024 steps)")


def test_slow_steps_window_keeps_enough_steps_to_judge():
    # 5 s steps: 30 s holds 6; the window reaches back to the 20 steps a verdict needs
    run = SyntheticRun(step_time_s=5.0, time_noise=0.0)
    run.steps(5, step_time_s=20.0)
    run.steps(100, input_wait_s=lambda s, w: 0.5 * 5.0)
    (f,) = findings(run.engine(), "input-bound")
    assert f.evidence["scope"] == "over the last 21 steps" and f.evidence["window_steps"] == 20


def test_a_short_episode_seen_live_is_in_the_replay_report_too():
    # 150 ms steps: 512 records (the record-count re-check) are 77 s, longer than the window;
    # a 40 s input-bound episode between two re-checks must still reach the report
    run = SyntheticRun(step_time_s=0.15, time_noise=0.0)
    run.steps(5, step_time_s=2.0)
    run.steps(300)
    run.steps(270, input_wait_s=lambda s, w: 0.5 * 0.15)
    run.steps(600)
    (f,) = findings(run.engine(), "input-bound")
    # the finding's steps are the windows that saw it (30 s each), not the run's first steps
    assert f.severity == "warning" and 150 < f.first_step and f.last_step <= 600

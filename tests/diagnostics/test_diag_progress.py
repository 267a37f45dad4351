"""stall and step-time-jitter."""

from diag_synthetic import SyntheticRun, findings

from tpuwatch.monitor.diagnostics import Engine
from tpuwatch.protocol import Config


def stalled(gap_s: float, **kw) -> SyntheticRun:
    run = SyntheticRun(**kw)
    run.steps(200)
    run.advance(gap_s)  # samples keep coming: the process lives
    return run


def test_stall_just_below_limit_is_silent():
    run = stalled(59.0)
    assert findings(run.engine(), "stall") == []


def test_stall_just_above_limit_fires_with_last_step():
    run = stalled(61.0)
    (f,) = findings(run.engine(), "stall")
    assert f.severity == "warning"
    assert f.evidence["last_step"] == 200 and f.evidence["ongoing"] == 1
    assert 60 <= f.evidence["gap_s"] <= 62
    assert "stack dump" in f.advice and "200" in f.advice
    assert f.worker == "host0:100"


def test_long_stall_is_critical():
    (f,) = findings(stalled(700.0).engine(), "stall")
    assert f.severity == "critical"


def test_limit_scales_with_slow_steps():
    # 5 s steps: 20 x median = 100 s
    run = SyntheticRun(step_time_s=5.0)
    run.steps(20)
    run.advance(95.0)
    eng = run.engine()
    assert findings(eng, "stall") == []
    run.advance(10.0)
    run.feed(eng)
    (f,) = findings(eng, "stall")
    assert 99 <= f.evidence["limit_s"] <= 101


def test_gap_measured_on_agent_clock_not_viewer_clock():
    # a report long after the run: samples show the process lived 30 s past the last step
    run = stalled(30.0)
    eng = run.engine()
    assert findings(eng, "stall", now=run.t + 86400) == []


def test_no_samples_falls_back_to_now():
    run = SyntheticRun(sample_every_s=None)
    run.steps(100)
    eng = run.engine()
    assert findings(eng, "stall", now=run.t + 30) == []
    (f,) = findings(eng, "stall", now=run.t + 65)
    assert f.evidence["ongoing"] == 1


def test_clean_exit_after_a_gap_is_not_a_stall():
    run = stalled(120.0)  # saving the model at the end
    run.exit(0)
    assert findings(run.engine(), "stall") == []


def test_killed_while_stalled_keeps_the_stall():
    run = stalled(120.0)
    run.exit(143, signal=15, source="launcher")
    (f,) = findings(run.engine(), "stall")
    assert f.evidence["ongoing"] == 0 and "killed" in f.message


def test_resumed_stall_is_reported_in_a_replay():
    run = stalled(90.0)
    run.steps(50)
    (f,) = findings(run.engine(), "stall")
    assert f.evidence["ongoing"] == 0 and "resumed at step 201" in f.message


def test_validation_at_epoch_boundary_is_not_a_stall():
    run = SyntheticRun()
    run.epoch_begin(0)
    run.steps(200, epoch=0)
    run.advance(150.0)  # a long validation pass
    run.epoch_end(0)
    run.epoch_begin(1)
    run.steps(200, epoch=1)
    eng = run.engine()
    assert findings(eng, "stall") == []
    # after a measured 150 s boundary gap, the next boundary may take 3 x 150 s
    run.advance(400.0)
    run.feed(eng)
    assert findings(eng, "stall") == []


def test_validation_before_epoch_end_message_uses_steps_per_epoch():
    run = SyntheticRun(config=Config(t=0.0, total_steps=600, epochs=3))
    run.steps(200, epoch=0)
    run.advance(200.0)  # validating: Keras sends epoch end after it
    assert findings(run.engine(), "stall") == []


def test_after_last_planned_step_is_not_a_stall():
    run = SyntheticRun(config=Config(t=0.0, total_steps=200))
    run.steps(200)
    run.advance(300.0)
    assert findings(run.engine(), "stall") == []


def test_mid_epoch_gap_with_known_epochs_still_stalls():
    run = SyntheticRun(config=Config(t=0.0, total_steps=600, epochs=3))
    run.steps(150, epoch=0)
    run.advance(70.0)
    assert [f.rule for f in findings(run.engine(), "stall")] == ["stall"]


def jittery(slow_factor: float, base: float = 0.05, every: int = 10, n: int = 400):
    run = SyntheticRun(step_time_s=base, time_noise=0.01)
    run.steps(5, step_time_s=3.0)  # warm-up
    run.steps(n, step_time_s=lambda s: base * slow_factor if s % every == 0 else base)
    return run.engine()


def test_jitter_just_below_ratio_is_silent():
    assert findings(jittery(1.9), "step-time-jitter") == []


def test_jitter_just_above_ratio_fires_info():
    (f,) = findings(jittery(2.15), "step-time-jitter")
    assert f.severity == "info"
    assert 2.0 <= f.evidence["p95_over_p50"] <= 2.3
    assert f.evidence["function"] == "train_step"
    assert "input" in f.advice and "retrace" in f.advice and "garbage" in f.advice


def test_strong_jitter_is_warning():
    (f,) = findings(jittery(5.0), "step-time-jitter")
    assert f.severity == "warning"


def test_jitter_of_a_few_ms_is_silent():
    assert findings(jittery(3.0, base=0.005, n=2000), "step-time-jitter") == []


def test_retraces_and_epoch_starts_are_not_jitter():
    run = SyntheticRun(step_time_s=0.05, time_noise=0.05)
    run.steps(5, step_time_s=3.0)
    for epoch in range(4):
        run.epoch_begin(epoch)
        run.steps(1, step_time_s=1.5, epoch=epoch)  # iterator start
        run.steps(149, epoch=epoch)
        run.retrace("train_step", 2 + epoch, 1 + epoch, "")  # each partial batch traces
        run.steps(1, step_time_s=2.0, epoch=epoch)
        run.epoch_end(epoch)
    assert findings(run.engine(), "step-time-jitter") == []


def trend(final: float):
    run = SyntheticRun(step_time_s=0.05, time_noise=0.03)
    run.steps(5, step_time_s=3.0)
    run.steps(1200, step_time_s=lambda s: 0.05 + (final - 0.05) * min(max(s - 400, 0) / 600, 1))
    return run.engine()


def test_rising_trend_threshold():
    assert findings(trend(0.07), "step-time-jitter") == []
    (f,) = findings(trend(0.08), "step-time-jitter")
    assert f.severity == "info" and "rising" in f.message
    assert 1.5 <= f.evidence["rise_ratio"] <= 1.7


def test_a_worker_that_exits_before_any_step_does_not_end_its_peers():
    # An exit is a fact about its own worker (one record per worker): the
    # engine used to end every worker without an exit when one that had run no step exited (a
    # launcher's exit under a name of its own), so a live peer's stall read as "killed" while
    # the dashboard showed it running. A single stream's launcher exit carries the worker's name.
    run = stalled(120.0, workers=2)
    run.emit(protocol_exit(run.t, 1, None), "worker:9")
    stalls = findings(run.engine(), "stall")
    assert stalls and all(f.evidence["ongoing"] == 1 and "killed" not in f.message for f in stalls)


def test_a_killed_workers_launcher_exit_ends_its_stall():
    run = stalled(120.0)
    run.emit(protocol_exit(run.t, 137, 9), run.names[0])
    (f,) = findings(run.engine(), "stall")
    assert f.evidence["ongoing"] == 0 and "killed" in f.message


def protocol_exit(t: float, code: int, signal: int):
    from tpuwatch.protocol import Exit

    return Exit(t=t, exit_code=code, signal=signal, source="launcher")


def fast_loop_with_hang(gap_s: float, step_s: float = 0.001) -> SyntheticRun:
    # a custom loop with ~1 ms steps that hangs in the middle, then resumes
    run = SyntheticRun(step_time_s=step_s, time_noise=0.1)
    run.steps(500)
    run.advance(gap_s)
    run.steps(500)
    run.exit(0)
    return run


def test_gap_that_ended_is_judged_by_the_runs_cadence():
    # the live floor is 60 s; a 1 ms-step loop's 40 s hang is still a stall once it is over
    (f,) = findings(fast_loop_with_hang(40.0).engine(), "stall")
    assert f.severity == "warning" and f.evidence["ongoing"] == 0
    assert f.evidence["last_step"] == 500 and "resumed at step 501" in f.message
    assert 39 <= f.evidence["gap_s"] <= 41 and f.evidence["limit_s"] == 10
    assert f.evidence["gaps"] == "after step 500: 40 s"


def test_cadence_limit_floor_is_10_s():
    assert findings(fast_loop_with_hang(9.5).engine(), "stall") == []
    (f,) = findings(fast_loop_with_hang(10.5).engine(), "stall")
    assert f.evidence["limit_reason"].startswith("300 x p95 step interval")


def test_cadence_limit_scales_with_p95():
    # 50 ms steps: 300 x p95 (~55 ms) is ~16 s
    assert findings(fast_loop_with_hang(14.0, step_s=0.05).engine(), "stall") == []
    (f,) = findings(fast_loop_with_hang(19.0, step_s=0.05).engine(), "stall")
    assert 15 <= f.evidence["limit_s"] <= 18


def test_every_long_gap_is_named_with_its_step_and_length():
    run = SyntheticRun(step_time_s=0.001, time_noise=0.1)
    run.steps(300)
    run.advance(20.0)
    run.steps(300)
    run.advance(45.0)
    run.steps(300)
    run.exit(0)
    (f,) = findings(run.engine(), "stall")
    assert f.evidence["long_gaps"] == 2
    assert f.evidence["gaps"] == "after step 300: 20 s; after step 600: 45 s"
    assert "2 long gaps in all" in f.message


def test_live_floor_still_holds_for_a_gap_going_on():
    # 40 s into a hang of a 1 ms loop, still going: below the live floor, no alarm yet
    run = SyntheticRun(step_time_s=0.001, time_noise=0.1)
    run.steps(500)
    run.advance(40.0)
    assert findings(run.engine(), "stall") == []


def test_live_stall_after_the_last_step_becomes_an_info_when_the_script_exits_cleanly():
    # TF destroying a distributed iterator at exit: 78 s after the last step, then exit 0
    run = SyntheticRun()
    run.steps(200)
    run.advance(70.0)
    eng = run.engine()
    (f,) = findings(eng, "stall")
    assert f.severity == "warning" and f.evidence["ongoing"] == 1  # while it lasts, it may be a hang
    run.advance(8.0)
    run.exit(0)
    run.feed(eng)
    (f,) = findings(eng, "stall")
    assert f.severity == "info" and f.evidence["finished_cleanly"] == 1
    assert "took 78 s to finish after its last step (200), then exited cleanly" in f.message
    # a gap that ended with more steps stays a warning, and a crash after the gap too
    run = SyntheticRun()
    run.steps(200)
    run.advance(70.0)
    eng = run.engine()
    findings(eng, "stall")
    run.exit(1)
    run.feed(eng)
    assert findings(eng, "stall")[0].severity == "warning"


def test_rising_trend_baseline_is_the_same_live_and_in_a_report():
    # the sample keras_fit run: replay said "138 ms now vs 84 ms (1.6x)", the report "vs 81 ms
    # (1.7x)": the baseline was the window of the first check, and a live viewer checks every
    # second while a report checks every 512 records. Steps drift from 80 to 90 ms early on.
    def run():
        r = SyntheticRun(step_time_s=0.08, time_noise=0.02)
        r.steps(5, step_time_s=3.0)
        r.steps(1200, step_time_s=lambda s: 0.08 + 0.01 * min(s / 500, 1) + (0.06 if s > 900 else 0.0))
        return r

    live = Engine(clock=lambda: 0.0)
    next_t = None
    for msg, worker in run().msgs:
        live.apply(msg, worker=worker)
        t = getattr(msg, "t", None)
        if t is not None and (next_t is None or t >= next_t):
            live.evaluate(now=t)  # a viewer evaluates about once a second
            next_t = t + 1.0
    (seen_live,) = [f for f in findings(live, "step-time-jitter") if "rising" in f.message]
    (reported,) = [f for f in findings(run().engine(), "step-time-jitter") if "rising" in f.message]
    assert seen_live.message == reported.message
    assert seen_live.evidence["median_start_ms"] == reported.evidence["median_start_ms"] < 82


# --- A gap is judged by its phases ---------------------------------------------------

def _phase(run: SyntheticRun, phase: str, since: float, calls: int = 0, detail: str = "") -> None:
    from tpuwatch.protocol import Phase

    run.emit(Phase(t=run.t, phase=phase, since=since, detail=detail, step=run.step, calls=calls))


def _evaluation(run: SyntheticRun, seconds: float, call_every_s: float | None) -> None:
    """An evaluation pass between two steps: its call count re-sent every ``call_every_s``
    (None: its calls stop after the first)."""
    since = run.t
    _phase(run, "evaluating", since, detail="test_step")
    calls, left = 0, seconds
    while left > 0:
        dt = min(call_every_s or seconds, left)
        run.advance(dt)
        left -= dt
        if call_every_s is not None:
            calls += 1
            _phase(run, "evaluating", since, calls, "test_step")
    _phase(run, "host", run.t)


def test_a_progressing_evaluation_between_steps_is_no_stall_live_or_ended():
    run = SyntheticRun()
    run.steps(50)
    _evaluation(run, 90.0, 0.5)  # past the 60 s live floor and the 10 s cadence limit
    eng = run.engine()
    assert findings(eng, "stall") == []  # live, at its end
    run.steps(20)
    run.feed(eng)
    assert findings(eng, "stall") == []


def test_an_evaluation_whose_calls_stop_is_a_stall():
    run = SyntheticRun()
    run.steps(50)
    _phase(run, "evaluating", run.t, detail="test_step")
    run.advance(2.0)
    _phase(run, "evaluating", run.t - 2.0, 3, "test_step")
    last_call = run.t
    run.advance(70.0)  # no further call
    eng = run.engine()
    (f,) = findings(eng, "stall")
    assert f.evidence["ongoing"] == 1 and f.evidence["phase"] == "evaluating"
    # the ledger's stalled time: from the evaluation's last call, not from the last step
    ((start, end),) = eng.stall_episodes(run.t)["host0:100"]
    assert abs(start - last_call) < 1e-6 and abs(end - run.t) < 1e-6
    assert 69 <= f.evidence["quiet_s"] <= 71 and 71 <= f.evidence["gap_s"] <= 73


def test_saves_and_new_iterators_progress_while_they_last_but_a_hang_after_them_stalls():
    run = SyntheticRun()
    run.steps(50)
    start = run.t
    _phase(run, "checkpointing", start, detail="CheckpointManager.save")
    run.advance(40.0)
    _phase(run, "iterator", run.t, detail="DistributedDataset.__iter__")
    run.advance(30.0)
    _phase(run, "host", run.t)
    run.steps(10)
    eng = run.engine()
    assert findings(eng, "stall") == []
    _phase(run, "host", run.t)
    run.advance(40.0)  # a real hang between two steps
    run.steps(10)
    run.feed(eng)
    (f,) = findings(eng, "stall")
    assert f.evidence["last_step"] == 60 and "resumed at step 61" in f.message


def _teardown(run: SyntheticRun, since: float, seconds: int, ended: bool = True) -> None:
    """TensorFlow deleting an iterator for ``seconds``: the agent's Teardown every second while it
    lasts, then once it ends."""
    from tpuwatch.protocol import Teardown

    for _ in range(seconds):
        run.advance(1.0)
        run.emit(Teardown(t=run.t, since=since, cpu_s=0.1, iterator="OwnedMultiDeviceIterator",
                          step=run.step, under_way=True))
    if ended:
        run.emit(Teardown(t=run.t, since=since, cpu_s=0.1, iterator="OwnedMultiDeviceIterator", step=run.step))


def test_an_iterator_teardown_between_steps_is_no_stall_live_or_ended():
    """TensorFlow deleting a tf.data iterator at an epoch boundary is named work, as the ledger
    books it: under load it took 25 s and more on a 2-core box, which the stall rule counted as a
    hang."""
    run = SyntheticRun()
    run.steps(50)
    since = run.t
    _phase(run, "host", since)
    _teardown(run, since, 90, ended=False)  # past the 60 s live floor
    eng = run.engine()
    assert findings(eng, "stall") == []  # live, while it lasts
    _teardown(run, since, 0)
    run.advance(0.5)
    run.steps(10)
    run.feed(eng)
    assert findings(eng, "stall") == []  # ended: past the 10 s limit of a gap that ended
    _phase(run, "host", run.t)
    run.advance(40.0)  # a real hang between two steps still is one
    run.steps(10)
    run.feed(eng)
    (f,) = findings(eng, "stall")
    assert f.evidence["last_step"] == 60 and f.evidence["long_gaps"] == 1


def test_a_teardown_that_never_ends_is_a_stall_after_300_s():
    # a deletion waiting on a tf.numpy_function that never returns: progress for 300 s, as a trace
    run = SyntheticRun()
    run.steps(50)
    since = run.t
    _phase(run, "host", since)
    _teardown(run, since, 290, ended=False)
    eng = run.engine()
    assert findings(eng, "stall") == []
    _teardown(run, since, 80, ended=False)
    run.feed(eng)
    (f,) = findings(eng, "stall")
    assert f.evidence["ongoing"] == 1 and 65 <= f.evidence["quiet_s"] <= 75


def test_a_late_look_at_a_teardown_that_ended_hides_no_hang():
    """The agent's thread can send its last look at a teardown (under way) after the message that
    it ended, even after the next step: the hang that follows is still one."""
    from tpuwatch.protocol import Teardown

    run = SyntheticRun()
    run.steps(50)
    since = run.t
    _phase(run, "host", since)
    _teardown(run, since, 5)
    late = Teardown(t=run.t - 0.5, since=since, cpu_s=0.1, iterator="OwnedMultiDeviceIterator",
                    step=run.step, under_way=True)
    run.emit(late)  # after its end
    run.steps(5)
    run.emit(late)  # after the next step
    run.advance(40.0)  # a hang between two training steps: no phase message
    run.steps(5)
    eng = run.engine()
    (f,) = findings(eng, "stall")
    assert f.evidence["last_step"] == 55 and f.evidence["gap_s"] >= 40


def test_a_teardown_inside_a_new_iterator_leaves_it_progressing():
    run = SyntheticRun()
    run.steps(50)
    _phase(run, "iterator", run.t, detail="DistributedDataset.__iter__")
    since = run.t
    _teardown(run, since, 5)  # the old iterator dropped while the new one is made
    run.advance(40.0)  # the new iterator still being made (its first batches fetched)
    _phase(run, "host", run.t)
    run.steps(10)
    eng = run.engine()
    assert findings(eng, "stall") == []


def test_every_stall_episode_stays_in_the_finding():
    # A live episode reported while it lasted stays listed once it ends, beside later ones.
    run = SyntheticRun()
    run.steps(50)
    run.advance(360.0)
    eng = run.engine()
    (live,) = findings(eng, "stall")
    assert live.evidence["ongoing"] == 1
    run.steps(50)
    run.advance(71.0)
    run.steps(5)
    run.feed(eng)
    (f,) = findings(eng, "stall")
    assert f.evidence["long_gaps"] == 2
    assert "after step 50: 6.0 min" in f.evidence["gaps"] and "after step 100" in f.evidence["gaps"]


def test_a_long_compile_after_a_retrace_is_no_stall_but_a_compile_that_never_ends_is():
    run = SyntheticRun()
    run.steps(50)
    run.retrace("train_step", traces=2, change="x: shape (64, 28) -> (32, 28)")
    run.advance(90.0)  # an XLA compile of the new shape
    eng = run.engine()
    assert findings(eng, "stall") == []
    run.steps(20)
    run.retrace("train_step", traces=3, change="x: shape (32, 28) -> (16, 28)")
    run.advance(400.0)  # 300 s of allowance, then 100 s with nothing progressing
    run.feed(eng)
    (f,) = findings(eng, "stall")
    assert f.evidence["ongoing"] == 1 and 95 <= f.evidence["quiet_s"] <= 105


# --- what stalled: the stacks the agent took, the step's input wait, the worker not arrived ---------


def _stall_stacks(run: SyntheticRun, worker: int, stalled_in: str, headline: str, input_line: str = ""):
    from tpuwatch.protocol import StackDump

    run.emit(StackDump(t=run.t, text="...", path=f"/r/stacks/stall-{worker}.txt", reason="stall", step=run.step,
                       gap_s=12.0, headline=headline, stalled_in=stalled_in, input_line=input_line),
             run.names[worker])


def test_a_live_stall_names_the_line_the_agents_stacks_show():
    run = stalled(12.0)
    _stall_stacks(run, 0, "script", "waiting at train.py:26: time.sleep(40)")
    run.advance(50.0)
    (f,) = findings(run.engine(), "stall")
    assert "waiting at train.py:26: time.sleep(40)" in f.message
    assert "train.py:26" in f.advice and "stack dump (the dashboard" not in f.advice
    assert f.evidence["stacks"] == "/r/stacks/stall-0.txt" and f.evidence["stalled_in"] == "script"


def test_a_stall_whose_step_waited_for_its_input_says_the_input_pipeline_stopped():
    run = SyntheticRun()
    run.steps(200)
    run.advance(25.0)
    run.steps(1, input_wait_s=24.9)  # the step that ended the gap waited for its batch all along
    (f,) = findings(run.engine(), "stall")
    assert "the input pipeline stopped: the step waited 25 s for its batch" in f.message, f.message
    assert "hung collective" not in f.advice and f.evidence["stalled_in"] == "input"


def test_a_gap_the_step_did_not_wait_for_keeps_the_generic_advice():
    run = SyntheticRun()
    run.steps(200)
    run.advance(25.0)
    run.steps(1)
    (f,) = findings(run.engine(), "stall")
    assert "input pipeline" not in f.message and "stack dump" in f.advice


def test_in_a_collective_hang_the_worker_not_arrived_is_named_with_its_line():
    run = SyntheticRun(workers=2)
    run.steps(200)
    run.advance(12.0)
    _stall_stacks(run, 0, "step", "inside the step called at train.py:55: loss = train_step(it) (TensorFlow's ...)")
    _stall_stacks(run, 1, "script", "waiting at train.py:40: time.sleep(30)")
    run.advance(50.0)
    by_worker = {f.worker: f for f in findings(run.engine(), "stall")}
    waiting, absent = by_worker["host0:100"], by_worker["host1:101"]
    assert "it waits for worker host1:101 waiting at train.py:40: time.sleep(30)" in waiting.message
    assert waiting.evidence["not_arrived"] == "worker host1:101 waiting at train.py:40: time.sleep(30)"
    assert "train.py:40" in waiting.advice
    assert "the other workers (host0:100) wait for it in the step" in absent.message


def test_a_slowdown_the_agent_captured_is_a_finding_with_its_profile_and_where_the_time_went():
    from tpuwatch.protocol import SlowSteps

    run = SyntheticRun()
    run.steps(200)
    run.emit(SlowSteps(t=run.t, path="/r/profiles/plugins/profile/p", function="train_step", first_slow_step=150,
                       step_from=156, step_to=175, slow_step_s=0.2, normal_step_s=0.01, slow_wait_s=0.0003,
                       normal_wait_s=0.0002, slow_between_s=0.001, normal_between_s=0.001))
    run.emit(SlowSteps(t=run.t, path="", function="train_step", first_slow_step=190, step_from=0, step_to=0,
                       slow_step_s=0.04, normal_step_s=0.01, slow_wait_s=0.03, normal_wait_s=0.0002,
                       error="cannot start the profiler"))
    slow, contention = sorted(findings(run.engine(), "slow-steps"), key=lambda f: f.first_step)
    assert slow.severity == "warning" and slow.evidence["profile_path"] == "/r/profiles/plugins/profile/p"
    assert "turned 20x slower from step 150" in slow.message and "steps 156-175" in slow.message
    assert "the time went to the step's own work" in slow.evidence["summary"]
    assert contention.severity == "info" and "no profile (cannot start the profiler)" in contention.message
    assert "the time went to waiting for input" in contention.evidence["summary"]


def test_the_events_log_says_the_agent_took_the_stacks_and_where_the_training_thread_waited():
    from tpuwatch.monitor.state import RunState

    run = stalled(12.0)
    _stall_stacks(run, 0, "script", "waiting at train.py:26: time.sleep(40)")
    state = RunState()
    for msg, worker in run.msgs:
        state.apply(msg, worker)
    (line,) = [e for e in state.snapshot(run.t).events if e.source == "agent:stacks"]
    assert line.message == ("no step for 12 s after step 200: the agent took every thread's stack; training thread "
                            "waiting at train.py:26: time.sleep(40) (/r/stacks/stall-0.txt)")

"""The auto-profile: when the step begins to wait for input the agent captures a
short profile through the profile command and measures each tf.data iterator's self time.

The trigger and the self-time arithmetic run without TensorFlow (a fake agent, iterator events
given as tuples); reading a capture file builds a small XSpace with TensorFlow's own proto."""

from __future__ import annotations

import tempfile
import threading

import pytest

from tpuwatch.agent import auto_profile, tf_data_trace
from tpuwatch.agent.auto_profile import AutoProfile
from tpuwatch.protocol import InputStages, step_values

MS = 10**9  # picoseconds in a millisecond


def test_self_time_is_the_duration_less_the_nested_iterators_on_the_same_line():
    consumer = [  # one fetch: Root 0-30 ms holds Prefetch 1-29 ms; nothing else on this line
        ("Root", 0, 30 * MS), ("Root::Prefetch", 1 * MS, 28 * MS),
    ]
    producer = [  # the prefetch's thread: MapAndBatch 0-20 ms with two source reads inside it,
        # one of which has a nested iterator of its own (charged to its parent only)
        ("Root::Prefetch::MapAndBatch", 0, 20 * MS),
        ("Root::Prefetch::MapAndBatch::TensorSlice", 2 * MS, 3 * MS),
        ("Root::Prefetch::MapAndBatch::TensorSlice::Inner", 3 * MS, 1 * MS),
        ("Root::Prefetch::MapAndBatch::TensorSlice", 10 * MS, 2 * MS),
        ("Root::Prefetch::MapAndBatch", 25 * MS, 5 * MS),  # a second call, after the first
    ]
    t = tf_data_trace.self_times([consumer, producer])
    got = dict(zip(t.names, t.self_s))
    assert got["Root"] == pytest.approx(0.002)  # 30 - 28
    assert got["Root::Prefetch"] == pytest.approx(0.028)  # its children run on another line
    assert got["Root::Prefetch::MapAndBatch"] == pytest.approx(0.020)  # (20 - 3 - 2) + 5
    assert got["Root::Prefetch::MapAndBatch::TensorSlice"] == pytest.approx(0.004)  # (3 - 1) + 2
    assert got["Root::Prefetch::MapAndBatch::TensorSlice::Inner"] == pytest.approx(0.001)
    assert dict(zip(t.names, t.calls))["Root::Prefetch::MapAndBatch"] == 2
    assert dict(zip(t.names, t.busy_s))["Root::Prefetch::MapAndBatch"] == pytest.approx(0.025)
    assert t.root_s == pytest.approx(0.030) and t.events == 7
    assert t.names[0] == "Root"  # root first, in chain order


def test_an_interleaves_inputs_are_one_iterator_whatever_element_they_read():
    # InputStages' contract: no per-element index (the viewer maps the chain onto stages as is)
    line = [("Root::Interleave", 0, 10 * MS), ("Root::Interleave[0]::Map", 1 * MS, 4 * MS),
            ("Root::Interleave[1]::Map", 5 * MS, 4 * MS)]
    t = tf_data_trace.self_times([line])
    assert t.names == ("Root::Interleave", "Root::Interleave::Map"), t
    assert t.self_s == pytest.approx((0.002, 0.008)) and t.calls == (1, 2)


class FakeProfiler:
    active = None


class FakeStepProbe:
    eager_distributed_fetches = 0


class FakeAgent:
    sample_interval_s = 0.25

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.submitted: list = []
        self.emitted: list = []
        self.profiler = FakeProfiler()
        self.step_probe = FakeStepProbe()
        self.step_taps: list = []
        self.samplers: list = []
        self.hooks: list = []
        self.clock = lambda: 1.0
        self.run_dir = tempfile.gettempdir()

    def event(self, level, source, message, **_):
        self.events.append((level, message))

    def submit(self, cmd, on_result=None):
        self.submitted.append((cmd, on_result))

    def emit(self, msg):
        self.emitted.append(msg)

    def add_sampler(self, name, sampler):
        self.samplers.append(sampler)

    def on_shutdown(self, hook):
        self.hooks.append(hook)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _play(auto: AutoProfile, clock: Clock, seconds: float, wait_frac: float, step: list[int],
          step_time_s: float = 0.05, eager_fetch: bool = False) -> list:
    """Steps of ``step_time_s`` waiting ``wait_frac`` of it, sampled at 4 Hz; the messages sent.
    ``eager_fetch``: each step's batch is a distributed one fetched eagerly."""
    out = []
    per_sample = int(0.25 / step_time_s)
    for _ in range(int(seconds / 0.25)):
        for _ in range(per_sample):
            step[0] += 1
            auto.agent.step_probe.eager_distributed_fetches += eager_fetch
            auto.tap(step_values(step=step[0], t=clock.t, step_time_s=step_time_s,
                                 input_wait_s=step_time_s * wait_frac, loss=None))
        clock.t += 0.25
        out.extend(auto())
    return out


def test_one_capture_per_input_bound_episode_through_the_profile_command():
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    _play(auto, clock, 5, 0.01, step)  # 1 % waiting: not input-bound
    assert agent.submitted == []
    _play(auto, clock, 3, 0.3, step)  # the wait rises: one capture, through the profile command
    ((cmd, on_result),) = agent.submitted
    assert (cmd.action, dict(cmd.args)) == ("profile", {"steps": auto_profile.CAPTURE_STEPS,
                                                        "max_s": auto_profile.CAPTURE_MAX_S})
    assert any("capturing a profile of 20 steps (at most 1 s)" in m for _, m in agent.events)
    on_result(False, "cannot start the profiler (already running)", {})
    _play(auto, clock, 5, 0.3, step)  # still the same episode: no second capture
    assert len(agent.submitted) == 1
    assert [m for lvl, m in agent.events if lvl == "warning"] == [
        "auto-profile: no capture (cannot start the profiler (already running))"]
    _play(auto, clock, 5, 0.0, step)  # the episode ends
    clock.t += auto_profile.MIN_GAP_S
    agent.profiler.active = object()  # a capture of the user's runs: none beside it
    _play(auto, clock, 3, 0.3, step)
    assert len(agent.submitted) == 1
    agent.profiler.active = None
    _play(auto, clock, 1, 0.3, step)  # a new episode, once the user's capture is done
    assert len(agent.submitted) == 2
    on_result(False, "again", {})
    _play(auto, clock, 1, 0.3, step)
    assert len([1 for lvl, _ in agent.events if lvl == "warning"]) == 1  # said once


def test_an_input_bound_episode_is_seen_where_the_wait_is_read_every_tenth_step():
    """Past a run's first records the in-graph wait is read at the read pace: a record that reads
    it carries the mean wait of every step since the last read; the others carry none. At 150 ms
    steps (the bundled sample's input-bound part) a 3 s window then held two records with a wait:
    fewer than MIN_STEPS, and the episode was never judged."""
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    for i in range(200):
        step[0] += 1
        clock.t += 0.15
        auto.tap(step_values(step=step[0], t=clock.t, step_time_s=0.15,
                             input_wait_s=0.12 if i % 10 == 9 else None, loss=None))
        if i % 2:
            auto()
        if agent.submitted:
            break
    assert len(agent.submitted) == 1 and step[0] <= 60, step
    assert any("waits for input" in m for _, m in agent.events), agent.events


def test_a_wait_read_covers_only_its_own_step_functions_steps():
    """A 150 ms step waiting 5 ms (3 %: not input-bound), its wait read every tenth call, between
    calls of a 10 ms function with no fetch (a GAN's other step, a helper): counting that one's
    steps at the wait read made the wait 6 % of the step time, an episode, a capture."""
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    for i in range(400):
        for fn, step_s, wait in (("train_step", 0.15, 0.005 if i % 10 == 9 else None), ("other", 0.01, None)):
            step[0] += 1
            clock.t += step_s
            auto.tap(step_values(step=step[0], t=clock.t, step_time_s=step_s, input_wait_s=wait, loss=None,
                                 function=fn))
        if i % 2:
            auto()
    assert agent.submitted == [], agent.events


def test_nothing_is_captured_when_the_wait_is_the_eager_fetch_of_distributed_batches():
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    agent.step_probe.eager_distributed_fetches = 3  # Keras' fit under a strategy, setting up
    _play(auto, clock, 5, 0.3, step, eager_fetch=True)  # for batch in dist_dataset: the fetch is the wait
    assert agent.submitted == [] and agent.events == []
    _play(auto, clock, 4, 0.3, step)  # the batches fetched in the step from here on: measured
    assert len(agent.submitted) == 1


def test_the_capture_is_read_and_sent_with_the_step_time_around_it(monkeypatch, tmp_path):
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    run = tmp_path / "plugins" / "profile" / "2026_11_26_02_48_55"
    run.mkdir(parents=True)
    (run / "host.xplane.pb").write_bytes(b"")
    times = tf_data_trace.IteratorTimes(names=("Root", "Root::Map"), self_s=(0.001, 0.9), calls=(20, 20),
                                        busy_s=(0.3, 0.9), root_s=0.3, events=40)
    monkeypatch.setattr(tf_data_trace, "read", lambda path: times)
    while not agent.submitted:
        _play(auto, clock, 0.25, 0.3, step, step_time_s=0.05)
    ((_, on_result),) = agent.submitted
    first = step[0] + 1
    _play(auto, clock, 1, 0.3, step, step_time_s=0.0625)  # inside the capture
    on_result(True, "captured", {"local_path": str(run), "path": str(run), "step": first, "steps": 16,
                                 "last_step": step[0], "capture_s": 1.2, "stopped_by": "time"})
    sent = _play(auto, clock, auto_profile.AFTER_S + 0.5, 0.3, step, step_time_s=0.05)
    if not sent:  # the capture is read on a thread of its own: the next sample sends it
        auto._reader.join(10)
        sent = _play(auto, clock, 0.25, 0.3, step, step_time_s=0.05)
    (m,) = sent
    assert isinstance(m, InputStages)
    assert (m.path, m.step_from, m.step_to, m.capture_s) == (str(run), first, first + 15, 1.2)
    assert (m.iterators, m.self_s, m.calls, m.busy_s, m.fetch_s) == (times.names, times.self_s, times.calls,
                                                                     times.busy_s, 0.3)
    assert m.step_time_before_s == pytest.approx(0.05)
    assert m.step_time_inside_s == pytest.approx(0.0625)
    assert m.step_time_after_s == pytest.approx(0.05)


def test_an_unreadable_capture_is_one_event():
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    _play(auto, clock, 3, 0.3, step)
    ((_, on_result),) = agent.submitted
    on_result(True, "captured", {"local_path": "/nonexistent/capture", "step": 1, "steps": 1,
                                 "stopped_by": "time"})
    assert _play(auto, clock, 3, 0.3, step) == []
    auto._reader.join(10)
    assert _play(auto, clock, 3, 0.3, step) == []
    (warning,) = [m for lvl, m in agent.events if lvl == "warning"]
    assert warning == "auto-profile: tf.data's events not read: no .xplane.pb in /nonexistent/capture"


@pytest.mark.tf
def test_a_capture_file_is_read_with_tensorflows_xplane_proto(tmp_path):
    import tensorflow  # noqa: F401  (the reader finds the proto module beside it)

    xplane_pb2 = tf_data_trace._load_module(tf_data_trace.xplane_pb2_path())
    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    for i, name in enumerate(("Iterator::Root", "Iterator::Root::Map", "IteratorGetNextOp::DoCompute"), start=1):
        plane.event_metadata[i].id = i
        plane.event_metadata[i].name = name
    line = plane.lines.add(id=7, name="tf_data_iterator_get_next")
    line.events.add(metadata_id=3, offset_ps=0, duration_ps=12 * MS)  # not an iterator: left out
    line.events.add(metadata_id=1, offset_ps=0, duration_ps=10 * MS)
    line.events.add(metadata_id=2, offset_ps=1 * MS, duration_ps=8 * MS)
    path = tmp_path / "host.xplane.pb"
    path.write_bytes(space.SerializeToString())
    t = tf_data_trace.read(path)
    assert dict(zip(t.names, t.self_s)) == pytest.approx({"Root": 0.002, "Root::Map": 0.008})
    assert t.root_s == pytest.approx(0.010) and t.events == 2
    with pytest.raises(tf_data_trace.TraceError, match="read up to 10"):
        tf_data_trace.read(path, max_bytes=10)
    path.write_bytes(b"\xff\xff not a proto")
    with pytest.raises(tf_data_trace.TraceError, match="cannot parse"):
        tf_data_trace.read(path)


@pytest.mark.tf
@pytest.mark.slow
def test_a_profile_the_script_starts_during_an_automatic_capture_wins(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    from tpuwatch_testing import child_env

    script = Path(__file__).parent / "scripts" / "profiles_itself.py"
    run_dir, own = tmp_path / "run", tmp_path / "own"
    proc = subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(run_dir),
                           str(script), str(own)], capture_output=True, text=True, timeout=300,
                          env=child_env(TPUWATCH_HOME=str(tmp_path / "home")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "own profile started" in proc.stdout and "own profile done" in proc.stdout and "trained" in proc.stdout
    assert list(own.glob("plugins/profile/*/*.xplane.pb"))  # the script's capture is whole
    msgs = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    (result,) = [m for m in msgs if m["kind"] == "result" and m["id"] == "auto-profile-1"]
    assert result["ok"] and result["details"]["stopped_by"] == "the script started a profile of its own", result


def test_nothing_is_captured_while_tracemalloc_traces():
    import tracemalloc

    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    tracemalloc.start()  # the leak doctor's window: the steps are slower meanwhile
    try:
        _play(auto, clock, 4, 0.3, step)
    finally:
        tracemalloc.stop()
    assert agent.submitted == []
    _play(auto, clock, 1, 0.3, step)
    assert len(agent.submitted) == 1


def test_nothing_is_captured_while_a_light_leak_window_samples():
    # the leak doctor's first window runs without tracemalloc: a capture meanwhile would grow RSS
    # with the profiler's buffers, which the window would take for the leak's
    class Doctor:
        window_open = True

    agent, clock, step = FakeAgent(), Clock(), [0]
    agent.leak_doctor = Doctor()
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    _play(auto, clock, 4, 0.3, step)
    assert agent.submitted == []
    agent.leak_doctor.window_open = False
    _play(auto, clock, 1, 0.3, step)
    assert len(agent.submitted) == 1


def test_a_capture_cut_short_is_not_measured(monkeypatch):
    """The script ended, or started a profile of its own, a few steps into the capture: too
    little to name a stage (it could override the pick by settings)."""
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    read = []
    monkeypatch.setattr(tf_data_trace, "read", lambda path: read.append(path))
    _play(auto, clock, 3, 0.3, step)
    ((_, on_result),) = agent.submitted
    on_result(True, "captured", {"local_path": "/tmp", "step": 61, "steps": 2, "last_step": 62,
                                 "stopped_by": "the script started a profile of its own"})
    assert _play(auto, clock, auto_profile.AFTER_S + 1, 0.3, step) == [] and read == []
    assert auto.state == "idle" and auto._reader is None
    assert any("cut short (the script started a profile of its own)" in m for _, m in agent.events)


def test_no_capture_without_room_in_the_run_directory(monkeypatch):
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    monkeypatch.setattr(auto_profile, "MIN_FREE_BYTES", 1 << 62)
    _play(auto, clock, 4, 0.3, step)
    assert agent.submitted == []
    monkeypatch.setattr(auto_profile, "MIN_FREE_BYTES", 0)
    _play(auto, clock, 1, 0.3, step)
    assert len(agent.submitted) == 1


def test_an_interleaves_numbered_inputs_are_one_stage():
    """``FlatMap[k]`` numbers the element read: summed as one stage before the ranking, so
    the children an interleave waits for are all subtracted from it."""
    producer = [("Root::Prefetch::ParallelInterleaveV4", 0, 100 * MS)]
    for k in range(200):  # 200 files, each its own numbered chain
        producer.append((f"Root::Prefetch::ParallelInterleaveV4[{k}]::TFRecord", k * MS // 2, MS // 4))
    t = tf_data_trace.self_times([producer])
    got = dict(zip(t.names, t.self_s))
    assert got == pytest.approx({"Root::Prefetch::ParallelInterleaveV4": 0.05,
                                 "Root::Prefetch::ParallelInterleaveV4::TFRecord": 0.05})
    assert dict(zip(t.names, t.calls))["Root::Prefetch::ParallelInterleaveV4::TFRecord"] == 200


@pytest.mark.tf
def test_a_start_that_fails_inside_tensorflow_leaves_no_session_behind(tmp_path, monkeypatch):
    """TF keeps the session of a start that failed with AlreadyExistsError (a profiler server's
    capture under way): every later start, the script's own too, then failed with "Another
    profiler is running"."""
    import tensorflow as tf
    from tensorflow.python.framework import errors
    from tensorflow.python.profiler import profiler_v2

    from tpuwatch.agent.agent_api import CommandRefused
    from tpuwatch.agent.profiler import Profiler
    from tpuwatch.protocol import Command

    class Busy:  # TF's C++ session while a profiler server captures
        def start(self, logdir, opts):
            raise errors.AlreadyExistsError(None, None, "Another profiler is running.")

    class Agent:
        run_dir = tmp_path
        global_step = 0
        step_probe = None

    monkeypatch.setattr(profiler_v2._pywrap_profiler, "ProfilerSession", Busy)
    with pytest.raises(CommandRefused, match="cannot start the profiler"):
        Profiler(Agent()).handle(Command(id="profile-1", action="profile", args={"ms": 100}))  # type: ignore[arg-type]
    monkeypatch.undo()
    assert profiler_v2._profiler is None
    tf.profiler.experimental.start(str(tmp_path / "the-scripts-own"))  # raised AlreadyExistsError before
    tf.profiler.experimental.stop()


def test_no_capture_where_several_workers_train_one_job():
    """A capture on one host slows every host's collectives (and a MultiWorkerMirroredStrategy
    worker whose script ended inside one died by SIGSEGV as the profiler stopped)."""
    agent, clock, step = FakeAgent(), Clock(), [0]
    agent.num_workers = 2
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    _play(auto, clock, 4, 0.3, step)
    assert agent.submitted == []
    agent.num_workers = 1
    _play(auto, clock, 1, 0.3, step)
    assert len(agent.submitted) == 1


def test_a_capture_the_training_paused_through_is_taken_again_soon(monkeypatch):
    """Seen in CI: a 1 s capture held one 0.12 s step (the training stood still ~1.1 s between
    two steps as it began), saw tf.data only waiting, and the episode's one capture was spent:
    the finding had no measured stage. A capture whose steps filled less than half of it is not a
    measurement; another follows in the same episode (within the run's MAX_CAPTURES)."""
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    read = []
    monkeypatch.setattr(tf_data_trace, "read", lambda path: read.append(path))
    while not agent.submitted:
        _play(auto, clock, 0.25, 0.3, step)
    ((_, on_result),) = agent.submitted
    auto.tap(step_values(step=step[0] + 1, t=clock.t, step_time_s=0.12, input_wait_s=0.06, loss=None))
    step[0] += 1
    on_result(True, "captured", {"local_path": "/tmp", "step": step[0], "steps": 1, "last_step": step[0],
                                 "capture_s": 1.11, "stopped_by": "time"})
    _play(auto, clock, auto_profile.RETRY_GAP_S + 1, 0.3, step)
    assert read == [] and len(agent.submitted) == 2
    assert any("held 1 step of 0.12 s in 1.11 s" in m for _, m in agent.events), agent.events
    # a capture whose steps fill it is read as usual
    (_, on_result), step_from = agent.submitted[1], step[0] + 1
    _play(auto, clock, 1, 0.3, step)
    on_result(True, "captured", {"local_path": "/tmp", "step": step_from, "steps": 20, "last_step": step[0],
                                 "capture_s": 1.0, "stopped_by": "time"})
    _play(auto, clock, 0.5, 0.3, step)
    assert auto._reader is not None  # read (no capture file here: one warning)
    assert len([m for _, m in agent.events if "held" in m]) == 1



def _short_capture(auto: AutoProfile, clock: Clock, step: list[int]):
    """2.5 ms steps waiting for input until a capture is asked for: (its Result's callback, the
    capture's first step, its 20 steps of 6.5 ms, and the Result's details for them), the steps
    not yet tapped."""
    while not auto.agent.submitted:
        _play(auto, clock, 0.25, 0.3, step, step_time_s=0.0025)
    ((_, on_result),) = auto.agent.submitted
    first = step[0] + 1
    rows = [step_values(step=first + i, t=clock.t, step_time_s=0.0065, input_wait_s=0.002, loss=None)
            for i in range(20)]
    details = {"local_path": "/tmp", "step": first, "steps": 20, "last_step": first + 19, "capture_s": 0.13,
               "stopped_by": "steps"}
    return on_result, first, rows, details


@pytest.mark.parametrize("tapped_before_result", [0, 6])
def test_a_short_captures_steps_count_as_inside_it_when_they_are_tapped_after_its_result(
        monkeypatch, tapped_before_result):
    """Seen in bench/overhead.py at a 2.2 ms step: 20 steps took 0.13 s, the capture's Result came
    before the agent's next drain tapped them, and the steps inside were counted as after it:
    "held 0 steps of 0.00 s in 0.13 s (the training stood still)", captured again, twice, and
    nothing measured. The capture's steps are known by their numbers, whenever they are tapped."""
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    read = []
    monkeypatch.setattr(tf_data_trace, "read", lambda path: read.append(path))
    on_result, first, rows, details = _short_capture(auto, clock, step)
    for row in rows[:tapped_before_result]:
        auto.tap(row)
    on_result(True, "captured", details)
    auto()  # a sample between the Result and the drain that taps the rest
    for row in rows[tapped_before_result:]:
        auto.tap(row)
    step[0] = first + 19
    _play(auto, clock, 0.5, 0.3, step, step_time_s=0.0025)
    assert not any("held" in m for _, m in agent.events), agent.events
    assert len(agent.submitted) == 1
    assert auto._reader is not None  # read (no capture file here: one warning)
    assert auto._inside == pytest.approx(0.0065)



def test_a_captures_calls_of_several_steps_are_sorted_by_their_first_step(monkeypatch):
    """steps_per_execution=4: a Step's number is its call's last step, the Result's its calls'
    first steps. The calls from the capture's first to its last are inside; later ones after."""
    # the reader thread finds no capture only once the assertions are done: a reader that gave
    # up at once set the state back to idle before they ran, once in about twelve runs
    read = threading.Event()
    monkeypatch.setattr(tf_data_trace, "find_capture", lambda path: read.wait(10) and None)
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    while not agent.submitted:
        _play(auto, clock, 0.25, 0.3, step, step_time_s=0.0025)
    ((_, on_result),) = agent.submitted
    first = step[0] + 1
    calls = [step_values(step=first + 4 * i + 3, t=clock.t, step_time_s=0.004 if i < 5 else 0.002,
                         input_wait_s=0.001, loss=None, steps=4) for i in range(8)]
    on_result(True, "captured", {"local_path": "/tmp", "step": first, "steps": 5, "last_step": first + 16,
                                 "capture_s": 0.08, "stopped_by": "steps"})
    for row in calls:
        auto.tap(row)
    auto()
    assert auto.state == "after" and auto._reader is not None
    assert (auto._inside_steps.steps, auto._phase.steps) == (20, 12)
    assert auto._inside == pytest.approx(0.004) and auto._phase.mean_step_s() == pytest.approx(0.002)
    read.set()
    auto._reader.join(10)


def test_a_captures_outcome_waits_for_its_steps_a_bounded_time():
    """Steps the Result names that never come (the training stopped for good right after it):
    the outcome is taken in after OUTCOME_WAITS samples with what was tapped."""
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    while not agent.submitted:
        _play(auto, clock, 0.25, 0.3, step)
    ((_, on_result),) = agent.submitted
    on_result(True, "captured", {"local_path": "/tmp", "step": step[0] + 1, "steps": 20,
                                 "last_step": step[0] + 20, "capture_s": 1.0, "stopped_by": "time"})
    for _ in range(auto_profile.OUTCOME_WAITS):
        auto()
    assert auto.state == "capturing" and not any("held" in m for _, m in agent.events)
    auto()
    assert any("held 0 steps of 0.00 s in 1.00 s" in m for _, m in agent.events), agent.events

# --- slow steps: the same budget, a second trigger ------------------------------------------------


def _steps(auto: AutoProfile, clock: Clock, n: int, step: list[int], step_time_s: float,
           between_s: float = 0.001, sample_every: int = 5, wait_s: float = 0.0002) -> list:
    out = []
    for i in range(n):
        step[0] += 1
        clock.t += step_time_s + between_s
        auto.tap(step_values(step=step[0], t=clock.t, step_time_s=step_time_s, input_wait_s=wait_s, loss=None,
                             function="train_step"))
        if i % sample_every == sample_every - 1:
            out.extend(auto())
    return out


def test_steps_twenty_times_slower_get_one_capture_of_them_and_a_slow_steps_message():
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    _steps(auto, clock, 200, step, 0.010)
    assert agent.submitted == []
    _steps(auto, clock, 4, step, 0.200, sample_every=1)  # four slow calls: not yet
    assert agent.submitted == []
    _steps(auto, clock, 1, step, 0.200, sample_every=1)  # the fifth
    ((cmd, on_result),) = agent.submitted
    assert cmd.action == "profile" and cmd.id.startswith("auto-profile-")
    assert any("3x slower or more from step 201" in m for _, m in agent.events), agent.events
    _steps(auto, clock, 20, step, 0.210, sample_every=1)  # the capture's steps
    on_result(True, "profile saved", {"path": "/r/profiles/p", "step": 206, "last_step": 225, "stopped_by": "steps"})
    auto()
    (msg,) = [m for m in agent.emitted if m.kind == "slow_steps"]
    assert (msg.path, msg.first_slow_step, msg.step_from, msg.step_to, msg.function) == (
        "/r/profiles/p", 201, 206, 225, "train_step")
    assert msg.slow_step_s == pytest.approx(0.21) and msg.normal_step_s == pytest.approx(0.010)
    assert msg.slow_wait_s == pytest.approx(0.0002) and msg.normal_between_s == pytest.approx(0.001)
    # once per slowdown, within the budget: the same slowdown going on captures nothing more
    _steps(auto, clock, 30, step, 0.200, sample_every=1)
    assert len(agent.submitted) == 1



def test_a_slowdown_that_goes_on_past_the_gap_between_captures_is_captured_once():
    """The bundled sample: steps 12x slower from step 595, captured at 613-619; the slowdown went
    on, and 60 s later (MIN_GAP_S) its calls, still counted against the median from before it,
    were a second slowdown "from step 621", captured again with the run's last capture. After a
    slowdown's capture the slow pace is the run's normal; a new slowdown is one against it."""
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    _steps(auto, clock, 200, step, 0.010)
    _steps(auto, clock, 5, step, 0.200, sample_every=1)
    ((_, on_result),) = agent.submitted
    _steps(auto, clock, 20, step, 0.210, sample_every=100)  # the capture's steps
    on_result(True, "profile saved", {"path": "/r/profiles/p", "step": 206, "last_step": 225, "stopped_by": "steps"})
    auto()
    assert len([m for m in agent.emitted if m.kind == "slow_steps"]) == 1
    captured_t = clock.t
    _steps(auto, clock, 400, step, 0.200, sample_every=1)  # the same slowdown, 80 s more
    assert clock.t - captured_t > auto_profile.MIN_GAP_S + 15
    assert len(agent.submitted) == 1 and len([m for m in agent.emitted if m.kind == "slow_steps"]) == 1
    # back to the old pace long enough to be the normal again; then a new slowdown is captured
    _steps(auto, clock, 150, step, 0.010)
    clock.t += auto_profile.MIN_GAP_S
    _steps(auto, clock, 5, step, 0.200, sample_every=1)
    assert len(agent.submitted) == 2
    assert any(f"from step {step[0] - 4}" in m for _, m in agent.events), agent.events


def test_a_slowdown_that_is_input_wait_is_captured_then_its_stages_are():
    """The bundled sample: its steps turn slow from step 595 because their input does. Where the
    slowdown's trigger fires first, its capture comes first, and the input episode that begins
    meanwhile gets its own capture after it: both are measured, the slowdown once."""
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    _steps(auto, clock, 200, step, 0.010)
    # slow, and nearly all of it waiting for the batch: one sample after five of them
    _steps(auto, clock, 5, step, 0.2, between_s=0.0, wait_s=0.19)
    ((cmd, on_result),) = agent.submitted
    assert any("slower or more" in m for _, m in agent.events), agent.events
    first = step[0] + 1
    # the capture's steps: the input episode begins meanwhile
    _steps(auto, clock, 20, step, 0.2, between_s=0.05, sample_every=1, wait_s=0.19)
    on_result(True, "profile saved", {"path": "/r/profiles/p", "step": first, "last_step": first + 19,
                                      "stopped_by": "steps"})
    _steps(auto, clock, 20, step, 0.2, between_s=0.05, sample_every=1, wait_s=0.19)
    assert [m.kind for m in agent.emitted].count("slow_steps") == 1
    assert len(agent.submitted) == 2, agent.events
    assert any("waits for input" in m for _, m in agent.events), agent.events


def test_a_slowdown_whose_capture_failed_may_be_captured_later():
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    _steps(auto, clock, 200, step, 0.010)
    _steps(auto, clock, 5, step, 0.200, sample_every=1)
    ((_, on_result),) = agent.submitted
    on_result(False, "cannot start the profiler", {})
    auto()
    (msg,) = [m for m in agent.emitted if m.kind == "slow_steps"]
    assert msg.error == "cannot start the profiler"
    _steps(auto, clock, 400, step, 0.200, sample_every=1)  # the same slowdown, 80 s more
    assert len(agent.submitted) == 2


def test_a_slow_captures_steps_tapped_after_its_result_are_its_own():
    """The slowdown's capture: its Result before its steps were tapped left its SlowSteps with the
    slow calls that set it off (the capture's own were counted as ordinary calls after it)."""
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    _steps(auto, clock, 200, step, 0.010)
    _steps(auto, clock, 5, step, 0.200, sample_every=1)
    ((_, on_result),) = agent.submitted
    on_result(True, "profile saved", {"path": "/r/profiles/p", "step": 206, "last_step": 225, "stopped_by": "steps"})
    auto()  # a sample before the drain that taps the capture's steps
    assert not [m for m in agent.emitted if m.kind == "slow_steps"]
    _steps(auto, clock, 20, step, 0.260, sample_every=100)  # the capture's steps, one drain
    _steps(auto, clock, 5, step, 0.010, sample_every=100)  # and steps after it, in the same drain
    auto()
    (msg,) = [m for m in agent.emitted if m.kind == "slow_steps"]
    assert (msg.step_from, msg.step_to) == (206, 225)
    assert msg.slow_step_s == pytest.approx(0.26) and msg.normal_step_s == pytest.approx(0.010)


def test_at_the_scripts_end_a_captures_steps_still_in_the_agents_buffer_are_measured(monkeypatch):
    """The script ended right after a short capture: its steps were still in the agent's buffer
    when the shutdown hook took the outcome in ("held 0 steps ... capturing again" at exit, and no
    measurement). The hook drains the buffer first."""
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    times = tf_data_trace.IteratorTimes(names=("Root", "Root::Map"), self_s=(0.001, 0.05), calls=(20, 20),
                                        busy_s=(0.06, 0.05), root_s=0.06, events=40)
    monkeypatch.setattr(tf_data_trace, "find_capture", lambda path: path)
    monkeypatch.setattr(tf_data_trace, "read", lambda path: times)
    on_result, first, buffered, details = _short_capture(auto, clock, step)
    agent.flush = lambda: [auto.tap(row) for row in buffered]  # the agent's drain taps them
    on_result(True, "captured", details)
    auto.shutdown()
    assert not any("held" in m for _, m in agent.events), agent.events
    (m,) = [m for m in agent.emitted if isinstance(m, InputStages)]
    assert (m.step_from, m.step_to) == (first, first + 19)
    assert m.step_time_inside_s == pytest.approx(0.0065)

def test_an_input_capture_just_before_does_not_hold_back_a_slowdowns_but_the_budget_is_shared():
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    _steps(auto, clock, 200, step, 0.010)
    auto._captures = auto_profile.MAX_CAPTURES - 1
    auto._last_t = clock.t  # an input capture a moment ago
    _steps(auto, clock, 5, step, 0.200, sample_every=1)
    ((cmd, on_result),) = agent.submitted
    on_result(False, "cannot start the profiler", {})  # before any call inside it
    auto()
    (msg,) = [m for m in agent.emitted if m.kind == "slow_steps"]
    assert msg.path == "" and msg.error == "cannot start the profiler"
    clock.t += auto_profile.MIN_GAP_S
    _steps(auto, clock, 100, step, 0.010)
    _steps(auto, clock, 10, step, 0.200, sample_every=1)  # a second slowdown: the budget is spent
    assert len(agent.submitted) == 1


def test_warm_up_a_lone_slow_call_and_a_retrace_are_no_slowdown():
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    traces = [0]
    auto._traces = lambda: traces[0]
    _steps(auto, clock, 15, step, 0.5)  # warm-up: tracing and compiling
    _steps(auto, clock, 200, step, 0.010)
    _steps(auto, clock, 1, step, 0.5)  # one slow call (a checkpoint, a GC pause)
    _steps(auto, clock, 50, step, 0.010)
    assert agent.submitted == []
    for _ in range(6):  # slow calls while the function retraces
        traces[0] += 1
        _steps(auto, clock, 1, step, 0.3, sample_every=1)
    assert agent.submitted == []
    agent.profiler.active = object()  # the user's own capture runs: never beside it
    _steps(auto, clock, 10, step, 0.3, sample_every=1)
    assert agent.submitted == []


def test_a_slowdown_that_begins_while_an_input_capture_is_measured_after_is_dated_from_its_first_step():
    # An input-bound capture's "after" measurement (the step time once the profiler stopped) was
    # running when the slowdown began: its slow calls were not counted until it ended, and the
    # finding said "from step 161" for a slowdown from step 150.
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    _steps(auto, clock, 200, step, 0.010)
    auto.state, auto._after_t0, auto._phase = "after", clock.t, auto_profile._Sums()
    _steps(auto, clock, 3, step, 0.200, sample_every=10)  # the after-measurement still runs
    assert auto.state == "after" and agent.submitted == []
    _steps(auto, clock, 12, step, 0.200, sample_every=1)  # it ends (AFTER_S): the capture starts
    ((cmd, _),) = agent.submitted
    assert cmd.action == "profile"
    assert any("3x slower or more from step 201" in m for _, m in agent.events), agent.events


def test_the_steps_between_a_slow_captures_result_and_its_outcome_are_not_a_new_slowdown():
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    _steps(auto, clock, 200, step, 0.010)
    _steps(auto, clock, 5, step, 0.200, sample_every=1)
    ((cmd, on_result),) = agent.submitted
    _steps(auto, clock, 20, step, 0.210, sample_every=100)  # the capture's steps
    on_result(True, "profile saved", {"path": "/r/profiles/p", "step": 206, "last_step": 225, "stopped_by": "steps"})
    _steps(auto, clock, 8, step, 0.210, sample_every=100)  # before the next sample takes the outcome in
    auto()
    # not a new slowdown wanting its capture: the capture's own, taken in with its outcome
    assert not auto._slow.want and auto._slow.run == 0 and auto.state == "idle"


def test_a_slowdown_that_begins_inside_an_input_capture_is_dated_from_its_first_step_and_captured_at_once():
    # slow_steps.py on a fast day: the input capture took steps 151-165, the slowdown began at
    # 150; its steps were skipped (the profiler slows a capture's steps), the after-measurement
    # ran 2 s more, and the slowdown was over before any capture of its own: no finding
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    _steps(auto, clock, 200, step, 0.010)
    auto.state, auto._kind = "capturing", "input"
    _steps(auto, clock, 10, step, 0.200, sample_every=100)  # inside the input capture: held
    auto.state, auto._after_t0, auto._phase = "after", clock.t, auto_profile._Sums()
    _steps(auto, clock, 1, step, 0.200, sample_every=1)  # the first after it: the run goes on
    ((cmd, _),) = agent.submitted  # no 2 s after-measurement first: the slowdown is captured now
    assert cmd.action == "profile"
    assert any("3x slower or more from step 201" in m for _, m in agent.events), agent.events


def test_slow_looking_steps_inside_an_input_capture_alone_are_no_slowdown():
    # the profiler slowed the capture's own steps; the steps after it are normal again
    agent, clock, step = FakeAgent(), Clock(), [0]
    auto = AutoProfile(agent, agent.profiler, clock=clock)  # type: ignore[arg-type]
    _steps(auto, clock, 200, step, 0.010)
    auto.state, auto._kind = "capturing", "input"
    _steps(auto, clock, 10, step, 0.200, sample_every=100)
    auto.state, auto._after_t0, auto._phase = "after", clock.t, auto_profile._Sums()
    _steps(auto, clock, 60, step, 0.010, sample_every=1)
    assert agent.submitted == [] and not auto._slow.want

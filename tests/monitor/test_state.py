"""RunState: statuses (with an injected clock), losses, commands, findings, workers, speed."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from monitor_recordings import DATA, mr, step

from tpuwatch.monitor.diagnostics.feed import FindingsFeed
from tpuwatch.monitor.monitor import Monitor
from tpuwatch.monitor.recording import read_all
from tpuwatch.monitor.state import RunState
from tpuwatch.protocol import (
    Command,
    CommandState,
    Config,
    Event,
    EventFact,
    ExceptionRaised,
    Exit,
    Finding,
    Result,
    Retrace,
    Step,
    decode,
)


class Clock:
    def __init__(self, t: float = mr.T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _take(monitor: Monitor, messages: list) -> None:
    for m in messages:
        monitor.take(m)


def state_of(name: str) -> RunState:
    messages, stats = read_all(DATA / name)
    s = RunState()
    s.apply_all(messages)
    s.note_read_stats(malformed=stats.malformed, unknown=stats.unknown,
                      truncated_tail=stats.truncated_tail)
    return s


def test_status_lifecycle_with_injected_clock():
    clock = Clock()
    monitor = Monitor(clock, every_s=0.0)  # "stalled" is the stall rule's verdict
    s, feed = monitor.state, monitor.feed
    assert s.snapshot().status == "waiting"
    _take(monitor, [mr.hello(mr.T0)])
    assert s.snapshot().status == "starting"
    _take(monitor, [step(i, mr.T0 + 10 + i * 0.5, step_time_s=0.5) for i in range(1, 101)])
    last_t = mr.T0 + 10 + 100 * 0.5
    clock.t = last_t + 1
    feed.evaluate(s, clock.t)
    assert s.snapshot().status == "running"
    clock.t = last_t + 59.9  # threshold is max(60 s, 20 x 0.5 s between records) = 60 s
    feed.evaluate(s, clock.t)
    assert s.snapshot().status == "running"
    clock.t = last_t + 60.1
    feed.evaluate(s, clock.t)
    snap = s.snapshot()
    assert snap.status == "stalled" and snap.now == clock.t
    _take(monitor, [step(101, clock.t, step_time_s=0.5)])
    assert s.snapshot().status == "running"
    s.apply(Exit(t=clock.t + 1, exit_code=0))
    clock.t += 1000
    snap = s.snapshot()
    assert snap.status == "finished" and snap.exit_code == 0 and snap.ended_t == snap.last_message_t


def test_findings_the_feed_recorded_are_not_applied_again_when_read_back():
    """The run's owner reads its own recording: the lines of the findings it
    recorded come back to it; applied again, a stale copy replaced the later verdict."""
    from tpuwatch import protocol

    clock = Clock()
    recorded: list[Finding] = []
    monitor = Monitor(clock, every_s=0.0, on_new=recorded.extend)
    s, feed = monitor.state, monitor.feed
    _take(monitor, [mr.hello(mr.T0), *(step(i, mr.T0 + 10 + i * 0.5, step_time_s=0.5) for i in range(1, 101))])
    clock.t = mr.T0 + 10 + 50 + 61
    feed.evaluate(s, clock.t)
    (stall,) = [f for f in recorded if f.rule == "stall"]
    # A later verdict on the same finding before the recorded line is read back.
    later = Finding(t=clock.t + 5, rule=stall.rule, severity="info", message="later", advice="",
                    evidence=stall.evidence, worker=stall.worker)
    s.add_finding(later, stall.worker)
    def as_read() -> Finding:  # the finding's line, as the recording gives it back
        return protocol.Decoder().decode(protocol.encode(stall).rstrip(b"\n"))

    assert not monitor.take(as_read())  # this feed's own line: skipped
    assert [f.message for f in s.snapshot().findings if f.rule == "stall"] == ["later"]
    assert not feed.read_back(as_read())  # once: a second copy is not this feed's line


def test_stall_threshold_scales_with_slow_steps():
    clock = Clock()
    monitor = Monitor(clock, every_s=0.0)
    s, feed = monitor.state, monitor.feed
    _take(monitor, [mr.hello()])
    _take(monitor, [step(i, mr.T0 + i * 10.0, step_time_s=10.0) for i in range(1, 21)])  # 20 x 10 s = 200 s
    clock.t = mr.T0 + 200 + 150
    feed.evaluate(s, clock.t)
    assert s.snapshot().status == "running"
    clock.t = mr.T0 + 200 + 201
    feed.evaluate(s, clock.t)
    assert s.snapshot().status == "stalled"


def test_crash_lost_and_exit_codes():
    s = RunState(clock=Clock())
    s.apply(mr.hello())
    s.apply(step(1, mr.T0 + 1))
    s.apply(ExceptionRaised(t=mr.T0 + 2, type="ValueError", message="bad shape", traceback="tb"))
    snap = s.snapshot()
    assert snap.status == "crashed" and snap.exception == "ValueError: bad shape"
    assert snap.exception_traceback == "tb"
    s.apply(Exit(t=mr.T0 + 3, exit_code=1))
    assert s.snapshot().exit_code == 1

    lost = RunState(clock=Clock())
    lost.apply(mr.hello())
    lost.apply(step(1, mr.T0 + 1))
    lost.set_lost("pid 4242 vanished")
    snap = lost.snapshot()
    assert snap.status == "lost" and snap.lost_reason == "pid 4242 vanished"
    assert snap.events[-1].level == "error" and "vanished" in snap.events[-1].message

    killed = RunState(clock=Clock())
    killed.apply(mr.hello())
    killed.apply(Exit(t=mr.T0 + 5, exit_code=137, signal=9, source="launcher", reason="killed"))
    snap = killed.snapshot()
    assert snap.status == "crashed" and snap.exit_signal == 9
    killed.set_lost()  # an exit record wins over a later "lost"
    assert killed.snapshot().status == "crashed"


def test_recorded_fixtures():
    healthy = state_of("healthy_4replica.jsonl")
    snap = healthy.snapshot(healthy.last_message_t)
    assert snap.status == "finished" and snap.step == 300 and snap.replicas == 4
    assert snap.strategy == "MirroredStrategy" and len(snap.devices) == 4
    assert snap.global_batch_size == 64 and snap.total_steps == 300
    assert snap.step_p50_s == pytest.approx(0.05, rel=0.05)
    assert snap.steps_per_s == pytest.approx(20, rel=0.05)
    assert snap.examples_per_s == pytest.approx(20 * 64, rel=0.05)
    assert snap.input_wait_frac is None  # input wait is the findings' figure: none evaluated
    feed = FindingsFeed()
    for m in read_all(DATA / "healthy_4replica.jsonl")[0]:
        feed.apply(m)
    feed.evaluate(healthy, healthy.last_message_t, force=True)
    fed = healthy.snapshot(healthy.last_message_t)
    assert fed.input_wait_frac == pytest.approx(0.02, rel=0.01) and fed.input_scope == "over the whole run"
    assert [f.name for f in snap.functions] == ["train_step"]
    assert snap.functions[0].traces == 2 and "(16, 28, 28, 1)" in snap.functions[0].last_change
    assert len(snap.device_memory) == 4 and snap.host_rss_peak_bytes == 2 * mr.GiB
    assert snap.device_peaks[-1][2] == 450 * mr.MiB
    assert [c.status for c in snap.commands] == ["done"]
    assert snap.epoch == 2
    assert len(snap.history) == 300  # below 2000 points: one record per point

    crashed = state_of("crashed.jsonl")
    snap = crashed.snapshot(crashed.last_message_t)
    assert snap.status == "crashed" and snap.exit_code == 1
    assert snap.exception.startswith("FloatingPointError")
    rows = {r.index: r for r in snap.replica_losses}
    assert not rows[2].finite and math.isnan(rows[2].deviation)
    finite = [rows[i].loss for i in (0, 1, 3)]
    mean = sum(finite) / 3
    assert rows[0].deviation == pytest.approx(rows[0].loss - mean)
    assert sum(rows[i].deviation for i in (0, 1, 3)) == pytest.approx(0, abs=1e-12)

    running = state_of("running_truncated.jsonl")
    snap = running.snapshot(running.last_message_t)
    assert snap.status == "running" and snap.truncated_tail
    assert snap.eta_s == pytest.approx((600 - snap.step) / snap.steps_per_s)

    waiting = state_of("waiting.jsonl").snapshot()
    assert waiting.status == "starting" and waiting.script == "train.py"


def test_commands_by_id():
    s = RunState(clock=Clock())
    s.apply(mr.hello())
    s.apply(Command(id="p1", action="profile", args={"duration_s": 2}))
    (c,) = s.snapshot().commands
    assert c.status == "pending" and c.details == {"duration_s": 2}
    s.apply(CommandState(t=mr.T0 + 1, id="p1", action="profile", state="queued"))
    s.apply(CommandState(t=mr.T0 + 2, id="p1", action="profile", state="running", step=40))
    assert s.snapshot().commands[0].status == "running"
    assert s.snapshot().commands[0].details["step"] == 40
    s.apply(Result(t=mr.T0 + 3, id="p1", action="profile", ok=False, message="profiler busy"))
    s.apply(CommandState(t=mr.T0 + 4, id="p1", action="profile", state="running"))  # late, ignored
    c = s.snapshot().commands[0]
    assert c.status == "failed" and c.message == "profiler busy" and c.t == mr.T0 + 3
    s.apply(Result(t=mr.T0 + 5, id="c2", action="checkpoint", ok=True, message="saved"))
    assert [c.id for c in s.snapshot().commands] == ["p1", "c2"]


def test_findings_latest_per_rule_worker_subject_and_logged_once():
    s = RunState(clock=Clock())
    s.apply(mr.hello())

    def f(sev, msg, fn="train_step", t=1.0):
        return Finding(t=mr.T0 + t, rule="retrace-storm", severity=sev, message=msg, advice="",
                       evidence={"function": fn})

    s.apply(f("warning", "5 traces"))
    s.apply(f("warning", "6 traces", t=2))
    s.apply(f("warning", "3 traces", fn="eval_step", t=3))
    snap = s.snapshot()
    assert sorted(x.message for x in snap.findings) == ["3 traces", "6 traces"]
    logged = [e for e in snap.events if e.source == "diagnostics:retrace-storm"]
    assert [e.message for e in logged] == ["5 traces", "3 traces"]
    s.apply(f("critical", "50 traces", t=4))
    assert s.snapshot().events[-1].level == "error"
    new = s.drain_new_findings()
    assert [x.message for x in new] == ["5 traces", "3 traces", "50 traces"]
    assert s.drain_new_findings() == []


def test_events_are_bounded_and_probes_tracked():
    s = RunState(clock=Clock(), max_events=50)
    s.apply(mr.hello())
    for i in range(200):
        s.apply(Event(t=mr.T0 + i, level="info", source="agent", message=f"e{i}"))
    s.apply(Event(t=mr.T0 + 300, level="warning", source="probe:input_wait",
                  message="probe input_wait disabled: AttributeError: no get_next"))
    s.apply(Retrace(t=mr.T0 + 301, function="f", traces=1, instances=1, signature="()", change=""))
    s.apply(Retrace(t=mr.T0 + 302, function="f", traces=2, instances=1, signature="(x)",
                    change="x: new"))
    snap = s.snapshot()
    assert len(snap.events) == 50
    assert snap.events[-1].message.startswith("traced f")  # only the first trace is an event
    assert snap.disabled_probes == {"input_wait": "AttributeError: no get_next"}


def test_a_new_function_object_keeps_its_change_the_agent_and_viewer_share_one_text():
    """The agent's 'new tf.function object' change and what the state (and the retrace rule)
    compare it with are one constant (it was a prefix of the agent's prose,
    written out again on the viewer's side)."""
    from tpuwatch.protocol import NEW_OBJECT_CHANGE

    s = RunState(clock=Clock())
    s.apply(mr.hello())
    s.apply(Retrace(t=mr.T0 + 1, function="f", traces=1, instances=1, signature="(x: (8,))", change=""))
    s.apply(Retrace(t=mr.T0 + 2, function="f", traces=2, instances=1, signature="(x: (4,))",
                    change="x: shape (8,) -> (4,)"))
    s.apply(Retrace(t=mr.T0 + 3, function="f", traces=3, instances=2, signature="(x: (8,))",
                    change=NEW_OBJECT_CHANGE))
    # A new object is its own cause: not replaced by the difference to the closest trace.
    assert [r.change for r in s.snapshot().retraces] == ["", "x: shape (8,) -> (4,)", NEW_OBJECT_CHANGE]


def test_two_workers_merge_by_worker_name():
    s = RunState(clock=Clock())
    for idx, name in enumerate(["h0:1", "h1:2"]):
        s.apply(mr.hello(worker=name, host=name.split(":")[0], pid=idx + 1), worker=name)
        s.apply(mr.topology(mr.T0, replicas=4, devices=(f"{name}/GPU:0", f"{name}/GPU:1")),
                worker=name)
    from dataclasses import replace

    s.apply(replace(s._workers["h1:2"].topology, worker_index=1), worker="h1:2")
    for i in range(1, 11):
        s.apply(step(i, mr.T0 + i, losses=(1.0, 1.0)), worker="h0:1")
        s.apply(step(i, mr.T0 + i, losses=(1.0, 5.0)), worker="h1:2")
    snap = s.snapshot(mr.T0 + 11)
    assert snap.num_workers == 2 and len(snap.workers) == 2
    assert [r.index for r in snap.replica_losses] == [0, 1, 2, 3]
    assert snap.replica_losses[3].worker == "h1:2" and snap.replica_losses[3].device == "h1:2/GPU:1"
    assert snap.replica_losses[3].deviation == pytest.approx(5.0 - 2.0)
    s.apply(Exit(t=mr.T0 + 12, exit_code=0), worker="h0:1")
    assert s.snapshot(mr.T0 + 12).status == "running"  # h1 still runs
    s.apply(Exit(t=mr.T0 + 12, exit_code=0), worker="h1:2")
    assert s.snapshot(mr.T0 + 12).status == "finished"


def test_config_merges_known_fields_and_eta():
    s = RunState(clock=Clock())
    s.apply(mr.hello())
    s.apply(Config(t=mr.T0, total_steps=1000, global_batch_size=32))
    s.apply(Config(t=mr.T0, epochs=5))
    for i in range(1, 101):
        s.apply(step(i, mr.T0 + i * 0.1, step_time_s=0.1))
    snap = s.snapshot(mr.T0 + 10.05)
    assert snap.total_steps == 1000 and snap.global_batch_size == 32 and snap.epochs == 5
    assert snap.eta_s == pytest.approx(900 / 10.0, rel=0.01)


@pytest.mark.slow
def test_a_million_steps_keep_the_history_bounded():
    """After a million steps the snapshot's history stays bounded and the state keeps counting.
    What apply and snapshot cost is measured by bench/model_costs.py, not asserted here."""
    s = RunState(clock=Clock())
    for m in mr.healthy_messages(20)[:8]:
        if not isinstance(m, Step):
            s.apply(m)
    losses = (0.5, 0.51, 0.49, 0.5)
    steps = [Step(i, mr.T0 + i * 0.01, 0.01, 0.0002, 0.5, losses, 1, 64, "train_step")
             for i in range(1, 1_000_001)]
    for m in steps:
        s.apply(m)
    del steps
    for i in range(30):
        s.apply(Step(1_000_001 + i, mr.T0 + 10_001 + i * 0.01, 0.01, 0.0002, 0.5, losses))
    snap = s.snapshot()
    assert len(snap.history) <= 2000 and snap.step == 1_000_030 and snap.steps_total == 1_000_030


def test_messages_before_the_hello_join_its_worker():
    s = RunState(clock=Clock())
    s.apply(step(1, mr.T0 + 1))  # attached mid-run: the hello comes later (or replayed)
    s.apply(mr.hello())
    s.apply(step(2, mr.T0 + 2))
    snap = s.snapshot(mr.T0 + 2)
    assert [w.name for w in snap.workers] == [mr.WORKER]
    assert snap.workers[0].step == 2 and snap.steps_total == 2


def test_the_strategy_shown_is_the_one_that_trained_most():
    """A 4-replica MirroredStrategy run that then evaluated a reloaded model under the
    default strategy was shown as the default strategy with 1 replica."""
    from dataclasses import replace

    s = RunState(clock=Clock())
    s.apply(mr.hello())
    s.apply(mr.topology(mr.T0))
    for i in range(1, 31):
        s.apply(step(i, mr.T0 + i, losses=(1.0, 1.0, 1.0, 1.0)))
    default = replace(mr.topology(mr.T0 + 31, replicas=1, devices=("CPU:0",)), strategy="_DefaultDistributionStrategy")
    s.apply(default)
    for i in range(31, 36):  # a few steps under the other strategy: still fewer
        s.apply(step(i, mr.T0 + i, losses=(1.0,)))
    snap = s.snapshot(mr.T0 + 40)
    assert snap.strategy == "MirroredStrategy" and snap.replicas == 4
    assert snap.strategies == (("MirroredStrategy", 4, 30), ("default strategy", 1, 5))


def test_users_names_for_strategy_classes():
    from tpuwatch.monitor.state import strategy_name

    assert strategy_name("CollectiveAllReduceStrategy") == "MultiWorkerMirroredStrategy"
    assert strategy_name("_DefaultDistributionStrategy") == "default strategy"
    assert strategy_name("TPUStrategyV2") == "TPUStrategy"
    assert strategy_name("MirroredStrategy") == "MirroredStrategy"


def test_a_fits_total_applies_to_that_fit_only():
    """'step 175/80 (100%) ... ETA 0.0s' after a second phase. The total is the global
    step at which the fit ends; past it the run has no known end."""
    s = RunState(clock=Clock())
    s.apply(mr.hello())
    s.apply(mr.topology(mr.T0))
    s.apply(Config(t=mr.T0, total_steps=20))
    for i in range(1, 11):
        s.apply(step(i, mr.T0 + i * 0.1, losses=(1.0,) * 4))
    assert s.snapshot(mr.T0 + 1.05).total_steps == 20
    for i in range(11, 26):
        s.apply(step(i, mr.T0 + i * 0.1, losses=(1.0,) * 4))
    snap = s.snapshot(mr.T0 + 2.6)
    assert snap.total_steps is None and snap.eta_s is None


def test_version_grows_with_news_but_not_with_steps_or_samples():
    # The dashboard watches this instead of building a snapshot per drain (tpuwatch/ui/pacer.py).
    state = RunState(clock=Clock())
    for m in (mr.hello(mr.T0), mr.topology(mr.T0)):
        state.apply(m)
    v = state.version
    state.apply_all(mr.steps(50, t0=mr.T0 + 1))
    state.apply_all(mr.samples(mr.T0 + 1, mr.T0 + 3))
    assert state.version == v
    # who another worker is: its row comes with the next frame (a pod's hosts join over seconds)
    state.apply(replace(mr.hello(mr.T0 + 3), worker="worker:1"), "worker:1")
    state.apply(mr.topology(mr.T0 + 3), "worker:1")
    state.apply(Config(t=mr.T0 + 3, global_batch_size=128), "worker:1")
    assert state.version == v
    state.apply(Event(t=mr.T0 + 4, level="warning", source="agent", message="something"))
    assert state.version > v
    v = state.version
    state.apply(Command(id="c1", action="profile", args={}))
    assert state.version > v
    v = state.version
    state.set_connected(True)  # no change
    assert state.version == v
    state.set_connected(False)
    assert state.version > v
    v = state.version
    state.apply(Exit(t=mr.T0 + 5, exit_code=0))
    assert state.version > v


def test_rolling_figures_are_recomputed_only_after_a_new_record():
    state = RunState(clock=Clock())
    state.apply_all(mr.steps(30, t0=mr.T0))
    stats = next(iter(state._workers.values())).stats
    first = stats.rolling()
    assert stats.rolling() is first  # nothing new: the same figures, not a new sort
    stats.add(step(31, t=mr.T0 + 10, step_time_s=9.0))
    assert stats.rolling() is not first and stats.rolling().step_p95_s > first.step_p95_s


def test_only_the_primary_worker_keeps_a_full_step_history():
    # A viewer of a pod holds every host's state: only worker 0's history is plotted.
    from tpuwatch.monitor.state import SECONDARY_HISTORY_POINTS
    from tpuwatch.protocol import Topology

    state = RunState(clock=Clock(), history_points=2000)
    for i in range(2):
        state.apply(mr.hello(mr.T0, worker=f"worker:{i}"), f"worker:{i}")
        state.apply(Topology(t=mr.T0, strategy="MultiWorkerMirroredStrategy", replicas=8, local_replicas=4,
                             num_workers=2, worker_index=i, device_kind="CPU", devices=mr.DEVICES, is_tpu=False),
                    f"worker:{i}")
        state.apply_all(mr.steps(1000, t0=mr.T0 + 1), f"worker:{i}")
    primary, other = state._workers["worker:0"], state._workers["worker:1"]
    assert len(primary.stats.history.points()) == 1000
    assert len(other.stats.history.points()) <= SECONDARY_HISTORY_POINTS
    snap = state.snapshot()
    assert len(snap.history) == 1000 and {w.step for w in snap.workers} == {1000}


# --- facts carried by Events as fields, not prose ------------------------------

def test_facts_are_read_from_the_events_fields_whatever_the_wording():
    """A probe's state, TPU metrics' availability and a stop request are typed fields of the Event
    both sides import (protocol.EventFact): rewording a message changes no panel."""
    s = RunState(clock=Clock())
    s.apply(mr.hello())
    s.apply(Event(t=mr.T0 + 1, level="warning", source="agent", message="input timing is off from here on",
                  fact=EventFact.PROBE_DISABLED, subject="input_wait", reason="AttributeError: no get_next"))
    s.apply(Event(t=mr.T0 + 2, level="warning", source="agent", message="no HBM figures from libtpu",
                  fact=EventFact.TPU_METRICS_UNAVAILABLE, reason="no libtpu metrics server on :8431"))
    snap = s.snapshot()
    assert snap.disabled_probes == {"input_wait": "AttributeError: no get_next"}
    assert snap.tpu_metrics_note == "no libtpu metrics server on :8431"
    s.apply(Event(t=mr.T0 + 3, level="info", source="agent", message="libtpu answers now",
                  fact=EventFact.TPU_METRICS_AVAILABLE))
    s.apply(Event(t=mr.T0 + 4, level="warning", source="agent", message="the user wants it to end",
                  fact=EventFact.STOP_REQUESTED, subject="tpuwatch stop"))
    s.apply(Exit(t=mr.T0 + 5, exit_code=143, signal=15, source="launcher", reason="SIGTERM"))
    snap = s.snapshot()
    assert snap.tpu_metrics_note == ""
    assert snap.status == "stopped"


def test_events_recorded_before_the_fact_fields_are_read_as_before():
    """Recordings made by earlier versions carry the facts in the message text only."""
    s = RunState(clock=Clock())
    s.apply(mr.hello())
    for line in (
        b'{"kind":"event","t":1795300004.5,"level":"warning","source":"probe:replica_loss",'
        b'"message":"probe replica_loss disabled: x"}',
        b'{"kind":"event","t":1795300005,"level":"warning","source":"tpu-metrics",'
        b'"message":"TPU metrics unavailable: no TPU chips found"}',
        b'{"kind":"event","t":1795300006,"level":"warning","source":"viewer","message":"stop requested from ls"}',
    ):
        msg = decode(line)
        assert isinstance(msg, Event) and msg.fact == ""
        s.apply(msg)
    snap = s.snapshot()
    assert snap.disabled_probes == {"replica_loss": "x"}
    assert snap.tpu_metrics_note == "no TPU chips found"
    s.apply(Exit(t=mr.T0 + 5, exit_code=143, signal=15, source="launcher", reason="SIGTERM"))
    assert s.snapshot().status == "stopped"


def test_the_headless_summary_error_line_is_whole_lines_not_a_cut_message():
    """The summary's `error` line printed a TF message's 2000 recorded characters,
    several lines ending mid-path. Now its first line, whole, and where the rest is."""
    from tpuwatch.console.headless import summary

    message = ("Graph execution error:\n\nDetected at node add defined at (most recent call last):\n"
               + "".join(f'  File "/home/user/project/train_{i}.py", line {i}, in step\n' for i in range(60)))[:2000]
    s = RunState(clock=Clock())
    s.apply(mr.hello())
    s.apply(step(1, mr.T0 + 1))
    s.apply(ExceptionRaised(t=mr.T0 + 2, type="InvalidArgumentError", message=message, traceback="tb"))
    s.apply(Exit(t=mr.T0 + 3, exit_code=1))
    lines = summary(s.snapshot()).splitlines()
    (error,) = [line for line in lines if line.lstrip().startswith("error")]
    assert error.split(None, 1)[1].startswith("InvalidArgumentError: Graph execution error: (+")
    assert "more lines" in error and "/home/user" not in error
    assert not any(line.startswith('  File "/home/user') for line in lines)


# --- one record per worker -------------------------------------------------------


def _feed(feed: FindingsFeed, s: RunState, messages: list) -> None:
    """The state, then an engine given the state or one of its own (what ``Monitor.take`` does
    with one given the state), so both kinds of engine can be asked."""
    for m in messages:
        s.apply(m)
        feed.apply(m)


def _restarted_then_hung(feed: FindingsFeed, s: RunState, clock: Clock) -> None:
    """200 steps, the step count restarted (a second loop from step 1) for 100 steps, then no
    step for 120 s."""
    _feed(feed, s, [mr.hello(mr.T0)] + [step(i, mr.T0 + 10 + i * 0.5, step_time_s=0.5) for i in range(1, 201)])
    t = mr.T0 + 10 + 200 * 0.5
    _feed(feed, s, [step(i, t + i * 0.5, step_time_s=0.5) for i in range(1, 101)])
    clock.t = t + 100 * 0.5 + 120
    feed.evaluate(s, clock.t)


@pytest.mark.parametrize("shared", [False, True])
def test_the_rules_and_the_dashboard_agree_on_a_workers_last_step(shared: bool):
    """The rules took a worker's highest step for its last, the dashboard its newest: after a
    restarted step count the stall was "after step 200" while the header said step 100, and the
    badge (the stall finding about the newest step) stayed "running"."""
    clock = Clock()
    s = RunState(clock=clock)
    feed = FindingsFeed(clock, every_s=0.0, **({"state": s} if shared else {}))
    _restarted_then_hung(feed, s, clock)
    snap = s.snapshot()
    (f,) = [f for f in snap.findings if f.rule == "stall"]
    assert snap.step == 100 and f.evidence["last_step"] == 100 and "after step 100" in f.message
    assert snap.status == "stalled"


def test_the_engine_beside_a_state_reads_the_states_worker_records():
    clock = Clock()
    s = RunState(clock=clock)
    feed = FindingsFeed(clock, every_s=0.0, state=s)
    _restarted_then_hung(feed, s, clock)
    _feed(feed, s, [Exit(t=clock.t, exit_code=0)])
    (w,) = s.telemetry.workers.values()
    assert feed.engine.telemetry is s.telemetry and w.name == mr.hello(mr.T0).worker
    assert w.exit is not None and w.ended and w.step == 100 and w.records == 300


def test_device_memory_follows_new_samples_between_snapshots():
    """A device's row is built again only for a new sample: the others are the same objects,
    and a device seen for the first time takes its place in the order."""
    from tpuwatch.protocol import DeviceSample

    def sample(device: str, t: float, used: int) -> DeviceSample:
        return DeviceSample(t=t, device=device, current_bytes=used, peak_bytes=used, limit_bytes=8 * mr.GiB)

    s = RunState()
    s.apply(mr.hello(mr.T0), "worker:1")
    s.apply(sample("/gpu:1", mr.T0, 1 * mr.GiB), "worker:1")
    s.apply(sample("/gpu:0", mr.T0, 2 * mr.GiB), "worker:1")
    first = s.snapshot(now=mr.T0 + 1).device_memory
    assert [(d.device, d.current_bytes) for d in first] == [("/gpu:0", 2 * mr.GiB), ("/gpu:1", 1 * mr.GiB)]
    s.apply(sample("/gpu:1", mr.T0 + 1, 3 * mr.GiB), "worker:1")
    s.apply(sample("/gpu:0", mr.T0 + 1, 2 * mr.GiB), "worker:0")  # another worker's device
    second = s.snapshot(now=mr.T0 + 2).device_memory
    assert [(d.worker, d.device, d.current_bytes) for d in second] == [
        ("worker:0", "/gpu:0", 2 * mr.GiB), ("worker:1", "/gpu:0", 2 * mr.GiB), ("worker:1", "/gpu:1", 3 * mr.GiB)]
    assert second[1] is first[0]  # no new sample: the same row


def test_a_workers_input_share_follows_its_window():
    """The live window's share is kept between evaluations and computed again once the window
    takes a record."""
    from tpuwatch.monitor.diagnostics.telemetry import Worker
    from tpuwatch.monitor.diagnostics.thresholds import Thresholds

    w = Worker("worker:0", Thresholds())
    for i in range(1, 60):
        w.on_step(step(i, mr.T0 + i * 0.1, step_time_s=0.1, wait=0.01))
    before = w.input_share()
    assert before == w.input_share() and before[0] is not None
    for i in range(60, 120):
        w.on_step(step(i, mr.T0 + i * 0.1, step_time_s=0.1, wait=0.09))
    after = w.input_share()[0]
    assert after is not None and after.share > before[0].share


def test_the_headers_steps_per_s_follows_a_slowdown_as_the_step_times_do():
    """The header's steps/s (a 30 s window) still read the old speed ~20 s after the steps slowed
    down, beside step times that were already the new ones."""
    s = RunState()
    s.apply(mr.hello(mr.T0))
    t, n = mr.T0 + 5, 0
    for _ in range(600):  # 10 steps/s for a minute ...
        n, t = n + 1, t + 0.1
        s.apply(step(n, t, step_time_s=0.1))
    for _ in range(12):  # ... then 1 step/s: 12 s later the header says so
        n, t = n + 1, t + 1.0
        s.apply(step(n, t, step_time_s=1.0))
    snap = s.snapshot()
    assert snap.step_time_s == pytest.approx(1.0)
    assert snap.steps_per_s == pytest.approx(1.0, rel=0.15)

"""The agent's PhaseTracker: one Phase per change, never per step; an evaluation's progress."""

from __future__ import annotations

from tpuwatch.agent.phases import PhaseTracker
from tpuwatch.agent.runtime import Agent
from tpuwatch.protocol import Phase


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(tmp_path) -> tuple[Agent, PhaseTracker, Clock]:
    clock = Clock()
    agent = Agent(tmp_path, "r", clock=clock)
    perf = Clock()
    tracker = PhaseTracker(agent, perf=perf)
    tracker.perf_clock = perf  # type: ignore[attr-defined]
    agent.phases = tracker
    return agent, tracker, clock


def phases(agent: Agent) -> list[Phase]:
    return [m for m in agent._buf if isinstance(m, Phase)]


def test_steps_send_one_training_phase_not_one_per_step(tmp_path):
    agent, tr, clock = make(tmp_path)
    tr.start(990.0)
    for _ in range(1000):
        clock.t += 0.01
        agent.global_step += 1
        if tr.pending or tr.current != "training":
            tr.on_step("train_step", clock.t - 0.01)
    sent = phases(agent)
    assert [p.phase for p in sent] == ["starting", "training"]
    assert sent[0].since == 990.0 and sent[1].since == 1000.0 and sent[1].detail == "train_step"


def test_a_lone_non_training_call_between_steps_stays_training(tmp_path):
    agent, tr, clock = make(tmp_path)
    agent.global_step = 5
    tr.on_step("train_step", clock.t)
    for _ in range(50):  # a metric update tf.function after every step
        tr.other_call("update_metrics", tr.perf())
        tr.on_step("train_step", clock.t)
    assert [p.phase for p in phases(agent)] == ["training"]


def test_two_test_calls_in_a_row_are_an_evaluation_from_the_first_ones_start(tmp_path):
    agent, tr, clock = make(tmp_path)
    agent.global_step = 30
    tr.on_step("train_step", clock.t)
    clock.t += 1.0
    tr.perf_clock.t = 50.0  # type: ignore[attr-defined]
    start = tr.perf()
    tr.perf_clock.t += 0.4  # type: ignore[attr-defined]
    clock.t += 0.4
    tr.other_call("test_step", start)
    tr.other_call("test_step", tr.perf())
    for _ in range(10):
        tr.other_call("test_step", tr.perf())
    ev = phases(agent)[-1]
    assert ev.phase == "evaluating" and ev.detail == "test_step" and abs(ev.since - 1001.0) < 1e-9
    assert tr.calls == 12
    (progress,) = tr.sample()
    assert progress.phase == "evaluating" and progress.calls == 12 and progress.since == ev.since
    assert tr.sample() == []  # no new call: nothing re-sent
    tr.on_step("train_step", clock.t)
    assert phases(agent)[-1].phase == "training"


def test_before_the_first_step_setup_calls_are_starting(tmp_path):
    agent, tr, _ = make(tmp_path)
    tr.start(990.0)
    for _ in range(5):
        tr.other_call("initialize", tr.perf())
    assert [p.phase for p in phases(agent)] == ["starting"]


def test_nested_saves_are_one_checkpointing_phase_then_host(tmp_path):
    agent, tr, _ = make(tmp_path)
    with tr.during("checkpointing", "Model.save"):
        with tr.during("checkpointing", "Model.save_weights"):
            tr.other_call("save_fn", tr.perf())
    sent = phases(agent)
    assert [(p.phase, p.detail) for p in sent] == [("checkpointing", "Model.save"), ("host", "")]


def test_keras_evaluation_brackets_and_a_failing_emit_never_raises(tmp_path):
    agent, tr, _ = make(tmp_path)
    tr.begin("evaluating", "evaluate")
    tr.other_call("test_function", tr.perf())
    tr.end()
    assert [p.phase for p in phases(agent)] == ["evaluating", "host"]

    def broken(t):
        raise RuntimeError("a bug in the tracker")

    tr._send = broken  # type: ignore[method-assign]
    with tr.during("checkpointing", "Checkpoint.save"):
        pass  # the user's save still runs and returns
    assert "phases" in agent.disabled_probes


def test_disabled_phases_send_nothing(tmp_path):
    agent, tr, clock = make(tmp_path)
    tr.enabled = False
    tr.start(990.0)
    agent.global_step = 3
    tr.on_step("train_step", clock.t)
    with tr.during("checkpointing", "Checkpoint.save"):
        pass
    assert phases(agent) == [] and tr.current == "host"

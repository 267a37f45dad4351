"""A top-level eager ``strategy.run`` as a step boundary (EagerStrategyRun), in-process with no
TensorFlow: the run stands for TF's, marking a gradient as the replica-loss probe's patch does."""

from __future__ import annotations

import pytest

from tpuwatch.agent.runtime import Agent
from tpuwatch.agent.steps import StepProbe
from tpuwatch.protocol import Step
from tpuwatch_testing import pending_agent


@pytest.fixture
def probe(tmp_path):
    agent = pending_agent(tmp_path)
    probe = StepProbe(agent)
    probe._last_strategy = probe.on_training_strategy = None
    yield probe
    agent.stop()


def _steps(agent: Agent) -> list[Step]:
    return [Step(*m) for m in agent._buf if type(m) is tuple]


def test_a_run_whose_replicas_compute_gradients_is_a_step(probe):
    run = probe.strategy_run
    seen = []

    def replicas():
        assert run.depth == 1
        probe.mark("training")  # what a replica's tape.gradient does
        probe.eager_losses = {0: ((0, True), 0.5), 1: ((0, True), 0.75)}
        return "per-replica result"

    probe.eager_wait_s = 0.004  # the batch's eager fetch before the run
    result = run.step(replicas, strategy="mirrored", read_losses=lambda: seen.append(run.flags) or (0.5, 0.75))
    assert result == "per-replica result" and run.depth == 0
    assert seen == [{"training": True, "strategy": "mirrored"}]
    (step,) = _steps(probe.agent)
    assert (step.step, step.function, step.loss, step.replica_losses) == (1, "strategy.run", 0.625, (0.5, 0.75))
    assert step.input_wait_s == 0.004 and step.step_time_s >= 0.004
    assert probe.agent.safe_points == [0]  # a command waiting ran before the run
    assert probe.eager_wait_s == 0.0


def test_a_run_that_computes_no_gradient_is_a_pause(probe):
    calls = []
    probe.agent.phases.other_call = lambda name, start: calls.append(name)
    probe.eager_wait_s = 0.004
    probe.strategy_run.step(lambda: None, strategy="mirrored", read_losses=lambda: pytest.fail("read"))
    assert _steps(probe.agent) == [] and calls == ["strategy.run"]
    assert probe.eager_wait_s == 0.0  # its batch's fetch was no training step's


def test_the_scripts_exception_passes_through_and_the_run_ends(probe):
    def replicas():
        probe.mark("training")
        raise ValueError("the script's own")

    with pytest.raises(ValueError, match="the script's own"):
        probe.strategy_run.step(replicas, strategy="mirrored", read_losses=lambda: None)
    assert probe.strategy_run.depth == 0 and _steps(probe.agent) == []

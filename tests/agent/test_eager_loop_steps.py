"""Where an eager loop's steps begin and end, and where its commands run: the step probe driven
call by call as a loop with no tf.function drives it (real tapes, real TensorFlow context; the
corpus runs the same shapes end to end)."""

from __future__ import annotations

import pytest

from tpuwatch_testing import pending_agent

pytestmark = pytest.mark.tf


def _tape():
    """A real tape; TensorFlow is imported here, when a test runs, not at collection."""
    import tensorflow as tf

    return tf.GradientTape()


def _probe(tmp_path):
    from tpuwatch.agent.steps import StepProbe

    agent = pending_agent(tmp_path)
    probe = agent.step_probe = StepProbe(agent)
    return agent, probe


def _update(probe, variables: tuple[int, ...], fetch: bool) -> None:
    """One tape, one gradient with respect to ``variables`` (ids), one eager update (after a fetch)."""
    if fetch:
        probe.eager_loop.fetched()
    probe.eager_loop.tape_entered(_tape())
    probe.eager_loop.gradient(variables)
    probe.eager_loop.applied()


@pytest.mark.parametrize("fetches", [True, False], ids=["dataset", "numpy"])
def test_a_gan_batch_is_one_step_and_commands_wait_for_its_generator(tmp_path, fetches):
    """A discriminator then a generator update on each of 4 batches: 4 steps, and a queued command
    (a checkpoint) runs before a discriminator update, never between the two (after the first
    batch, where the loop's shape is not known yet)."""
    agent, probe = _probe(tmp_path)
    d, g = (1, 2), (3, 4)  # the discriminator's variables, the generator's
    for _ in range(4):
        _update(probe, d, fetch=fetches)
        _update(probe, g, fetch=False)
    assert agent.global_step == 4
    # Before each discriminator update (at global steps 0..3), and before the first generator's.
    assert agent.safe_points == [0, 1, 1, 2, 3]


def test_updates_of_the_same_variables_without_fetches_are_a_step_each(tmp_path):
    """A loop over NumPy slices (it fetched one batch from a dataset once, to look at it): each
    update of the same variables is a step, whatever optimizer object makes it (one made anew
    each epoch to change the learning rate), and each has a safe point before it."""
    agent, probe = _probe(tmp_path)
    probe.eager_loop.fetched()
    for _ in range(5):
        _update(probe, (1, 2), fetch=False)
    assert agent.global_step == 5
    assert agent.safe_points == [0, 1, 2, 3, 4]


def test_micro_batches_are_one_step_and_a_compiled_step_clears_eager_gradients(tmp_path):
    """Three fetched micro-batches' gradients, one update: one step. An eager gradient, then a step
    some other way (a tf.function's record), then an eager update of gradients that function
    returned: no second step."""
    agent, probe = _probe(tmp_path)
    for _ in range(3):
        probe.eager_loop.fetched()
        probe.eager_loop.tape_entered(_tape())
        probe.eager_loop.gradient((1, 2))
    probe.eager_loop.applied()
    assert agent.global_step == 1
    probe.eager_loop.tape_entered(_tape())
    probe.eager_loop.gradient((1, 2))
    probe._emit("train_step", 1, 0.01, None, None, None)  # what a tf.function step's record ends in
    probe.eager_loop.applied()
    assert agent.global_step == 2


def test_an_fgsm_tape_starts_the_step_it_belongs_to(tmp_path):
    """Adversarial training: the perturbation's tape (a gradient with respect to the batch) opens
    the step, and the training tape after it does not restart its clock or give commands a
    safe point; the next batch's fetch does."""
    agent, probe = _probe(tmp_path)
    for _ in range(2):
        probe.eager_loop.fetched()
        probe.eager_loop.tape_entered(_tape())
        probe.eager_loop.probe_gradient()
        started = probe.eager_loop.start
        probe.eager_loop.tape_entered(_tape())
        assert probe.eager_loop.start == started
        probe.eager_loop.gradient((1, 2))
        probe.eager_loop.applied()
    assert agent.global_step == 2
    assert agent.safe_points == [0, 1]

"""A tf.function running eagerly counts its own steps (EagerFunctionCall, no TensorFlow): its
strategy.runs that trained, else its batches by the gradients of one set of variables."""

from __future__ import annotations

from tpuwatch.agent.eager_function import EagerFunctionCall


def test_strategy_runs_that_trained_are_its_steps():
    call = EagerFunctionCall()
    call.start()
    call.gradient((1, 2))  # a gradient outside any run does not count when runs did
    call.runs = 3
    assert call.steps() == 3


def test_a_loop_over_batches_with_a_gans_two_tapes_counts_its_batches():
    call = EagerFunctionCall()
    call.start()
    for _ in range(4):
        call.gradient((1, 2))  # the discriminator's variables
        call.gradient((3, 4))  # the generator's
        call.gradient(())  # an FGSM-style gradient with respect to tensors
    assert call.steps() == 4 and call.step_index() == 4


def test_gradients_with_respect_to_tensors_only_are_one_step_and_none_is_none():
    call = EagerFunctionCall()
    call.start()
    assert call.steps() == 0
    call.gradient(())
    assert call.steps() == 1  # traced, those train (a TPU embedding's)


def test_each_call_starts_afresh():
    call = EagerFunctionCall()
    call.start()
    call.runs = 2
    call.gradient((1, 2))
    call.active = False
    call.start()
    assert call.active and call.steps() == 0

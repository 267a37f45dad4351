"""The TPU code paths cannot run here (no TPU); what can be checked is that they are chosen:
the TPU strategies' own run() implementations are patched, and restored."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.tf


def test_tpu_strategies_run_is_patched_and_restored(tmp_path):
    from tensorflow.python.distribute import (
        distribute_lib,
        one_device_strategy,
        tpu_strategy,
    )

    from tpuwatch.agent import post_import, probes
    from tpuwatch.agent.runtime import Agent

    owners = [tpu_strategy.TPUStrategyV2, tpu_strategy.TPUStrategy, tpu_strategy.TPUStrategyV1,
              one_device_strategy.OneDeviceStrategy, distribute_lib.StrategyBase]
    before = {cls: vars(cls)["run"] for cls in owners}
    agent = Agent(tmp_path, "t")
    patches = probes.install_all(agent, "t.py", ["t.py"], set())  # TF is imported: installs at once
    try:
        for cls in owners:
            run = vars(cls)["run"]
            assert run is not before[cls], cls
            assert run.__tpuwatch_original__ is before[cls], cls
        assert not agent.disabled_probes, agent.disabled_probes
    finally:
        probes.uninstall(patches)
        post_import.cancel_all()
        agent.stop()
    for cls in owners:
        assert vars(cls)["run"] is before[cls]


def test_a_step_inside_a_tpu_computation_is_not_ordered_through_it(tmp_path):
    """Keras' step under TPUStrategy is a nested call inside ``tpu.replicate``. The identities
    that order a step after its fetch's (float64, host) timestamp must not land inside the TPU
    computation: TPUReplicateContext pulls their control input in as an F64 identity, which XLA
    on a TPU cannot compile. Traced only (no TPU here); the graph is what would be compiled."""
    import tensorflow as tf

    from tpuwatch.agent import post_import, probes
    from tpuwatch.agent.runtime import Agent

    agent = Agent(tmp_path, "t")
    patches = probes.install_all(agent, "t.py", ["t.py"], set())
    try:
        @tf.function
        def one_step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = tf.reduce_sum(x * x)
            return tape.gradient(y, x)

        @tf.function
        def multi_step(iterator):
            x = next(iterator)
            return tf.compat.v1.tpu.replicate(lambda v: one_step(v), inputs=[[x]])

        iterator = iter(tf.data.Dataset.from_tensors(tf.ones([2])).repeat())
        # Called as a script calls it, so the agent sees a top-level step call; the trace is what
        # counts: running it needs a TPU system, which this machine has not.
        try:
            multi_step(iterator)
        except (tf.errors.OpError, ValueError, RuntimeError):
            pass
        graph = multi_step.get_concrete_function(iterator).graph
        assert agent.enabled("input_wait")
        in_tpu = [op for op in graph.get_operations() if "_tpu_replicate" in op.node_def.attr]
        assert any(op.type in ("StatefulPartitionedCall", "PartitionedCall") for op in in_tpu)
        doubles = [op.name for op in in_tpu
                   if any(t.dtype == tf.float64 for t in list(op.inputs) + list(op.outputs))]
        assert doubles == [], doubles
    finally:
        probes.uninstall(patches)
        post_import.cancel_all()
        agent.stop()


def test_a_batch_fetched_for_a_tpu_is_handed_over_as_tensorflow_made_it():
    # on a CPU or GPU strategy the timed fetch hands its batch over through identities that wait
    # for the second timestamp; a TPUStrategy's batch goes into an XLA computation untouched
    from tensorflow.python.distribute import mirrored_strategy, tpu_strategy

    from tpuwatch.agent.input_wait import _on_tpu

    class TPUIterator:
        _strategy = object.__new__(tpu_strategy.TPUStrategyV2)  # no TPU needed: the class decides

    class MirroredIterator:
        _strategy = object.__new__(mirrored_strategy.MirroredStrategy)

    assert _on_tpu(TPUIterator())
    assert not _on_tpu(MirroredIterator()) and not _on_tpu(object())

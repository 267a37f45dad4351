"""An in-graph fetch of an Optional (Keras' loop with ``steps_per_execution`` > 1 fetches its next
batch with ``get_next_as_optional``): the examples it holds are counted with no branch where the
element spec fixes the batch size, through a ``tf.cond`` where it does not, and as none when the
data has run out. In-process, the probes installed and removed as tests/agent/test_tpu_paths.py
does."""

from __future__ import annotations

import pytest

from tpuwatch.agent.accumulator import EXAMPLES, FETCHES

pytestmark = pytest.mark.tf


def _fetch_all(tmp_path, dataset, calls: int) -> tuple[list[bool], list[str], list[float]]:
    """Calls a tf.function that fetches one Optional ``calls`` times: whether each held a batch,
    the branch ops in its graph, and the accumulator's values."""
    import tensorflow as tf

    from tpuwatch.agent import post_import, probes
    from tpuwatch.agent.runtime import Agent

    agent = Agent(tmp_path, "t")
    patches = probes.install_all(agent, "t.py", ["t.py"], set())
    try:
        @tf.function
        def fetch(iterator):
            return iterator.get_next_as_optional().has_value()

        iterator = iter(dataset)
        held = [bool(fetch(iterator)) for _ in range(calls)]
        graph = fetch.get_concrete_function(iterator).graph
        branches = [op.type for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
        assert agent.enabled("input_wait") and agent.enabled("examples"), agent.disabled_probes
        return held, branches, agent.step_probe.read_accumulator().tolist()
    finally:
        probes.uninstall(patches)
        post_import.cancel_all()
        agent.stop()


def test_batches_of_a_fixed_size_are_counted_with_no_branch(tmp_path):
    import tensorflow as tf

    dataset = tf.data.Dataset.range(40).batch(8, drop_remainder=True)  # 5 batches of 8
    held, branches, acc = _fetch_all(tmp_path, dataset, 6)
    assert held == [True] * 5 + [False]
    assert branches == []
    assert (acc[FETCHES], acc[EXAMPLES]) == (6.0, 40.0)  # the empty one fetched, holding none


def test_batches_whose_size_varies_are_counted_through_a_branch(tmp_path):
    import tensorflow as tf

    dataset = tf.data.Dataset.range(20).batch(8)  # 8, 8 and 4: the spec leaves the size open
    held, branches, acc = _fetch_all(tmp_path, dataset, 4)
    assert held == [True, True, True, False]
    assert len(branches) == 1
    assert (acc[FETCHES], acc[EXAMPLES]) == (4.0, 20.0)


class _Optional:
    def __init__(self, spec) -> None:
        self.element_spec = spec


class _NoSpec:
    @property
    def element_spec(self):
        raise NotImplementedError("no spec")


def test_the_examples_a_spec_fixes():
    """The batch size of the spec's first element (dict keys in tf.nest's order), summed over a
    distributed value's replicas; None wherever the value itself must be asked."""
    import tensorflow as tf
    from tensorflow.python.distribute.values import PerReplicaSpec

    from tpuwatch.agent.input_wait import _static_spec_examples

    def examples(spec):
        return _static_spec_examples(_Optional(spec))

    assert examples((tf.TensorSpec([8, 3]), tf.TensorSpec([8]))) == 8
    assert examples(PerReplicaSpec(tf.TensorSpec([8, 3]), tf.TensorSpec([8, 3]))) == 16
    assert examples((PerReplicaSpec(tf.TensorSpec([4, 3]), tf.TensorSpec([4, 3])), tf.TensorSpec([1]))) == 8
    assert examples({"b": tf.TensorSpec([None]), "a": tf.TensorSpec([8])}) == 8  # "a" first
    assert examples({"a": tf.TensorSpec([None]), "b": tf.TensorSpec([8])}) is None
    assert examples(tf.RaggedTensorSpec([8, None], tf.float32)) == 8  # its rows
    assert examples(PerReplicaSpec(tf.TensorSpec([None, 3]), tf.TensorSpec([None, 3]))) is None
    for open_spec in (tf.TensorSpec([]), tf.TensorSpec(None), (), None):
        assert examples(open_spec) is None, open_spec
    assert _static_spec_examples(_NoSpec()) is None
    assert _static_spec_examples(object()) is None

"""Fetch ordering on its own, in-process: a tf.function called in a graph after a timed fetch gets its
batch through an Identity that waits for the fetch's second timestamp; in a graph with no timed
fetch, nothing is touched. (test_step_order.py checks a real fit end to end.)"""

from __future__ import annotations

import pytest

from tpuwatch.agent.fetch_order import FetchOrder

pytestmark = pytest.mark.tf


def _call_in(graph, order: FetchOrder, timed: bool):
    import tensorflow as tf

    @tf.function
    def step(batch):
        return batch * 2.0

    with graph.as_default():
        batch = tf.constant([1.0, 2.0])
        stamp = tf.timestamp()
        if timed:
            order.timed(graph, stamp.op)
        mark = order.before_call(graph)
        step(batch)
        if mark is not None:
            order.after_call(graph, mark)
    (call,) = [op for op in graph.get_operations() if op.type in ("StatefulPartitionedCall", "PartitionedCall")]
    return call, batch, stamp


def test_a_call_after_a_timed_fetch_waits_for_its_timestamp():
    import tensorflow as tf

    order = FetchOrder()
    call, batch, stamp = _call_in(tf.Graph(), order, timed=True)
    (gated,) = call.inputs
    assert gated.op.type == "Identity" and stamp.op in gated.op.control_inputs
    assert gated.op.inputs[0] is batch  # the batch itself, colocated with it: no copy
    assert stamp.op not in call.control_inputs  # the data waits, not every op of the body


def test_a_graph_with_no_timed_fetch_is_left_alone():
    import tensorflow as tf

    order = FetchOrder()
    call, batch, _ = _call_in(tf.Graph(), order, timed=False)
    assert list(call.inputs) == [batch] and not call.control_inputs
    assert order.before_call(None) is None  # an eager call

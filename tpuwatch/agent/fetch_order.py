"""Fetch ordering: a tf.function called after a timed in-graph fetch starts once the fetch is timed.

The input-wait probe puts ``tf.timestamp()`` before and after each in-graph ``get_next`` and
notes, per graph, the op of the second timestamp (:meth:`FetchOrder.timed`). A tf.function called
next in that graph (Keras' ``one_step_on_data`` on the batch) is then ordered after it
(:func:`gate`) by the step probe's call wrapper, which brackets the call with
:meth:`FetchOrder.before_call` and :meth:`FetchOrder.after_call`. Only while tracing; nothing per
step.
"""

from __future__ import annotations

import weakref
from typing import Any


class FetchOrder:
    """Graph -> the second timestamp of its last timed in-graph fetch (weak: graphs come and go)."""

    def __init__(self) -> None:
        self._timed: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def timed(self, graph: Any, op: Any) -> None:
        """A fetch in ``graph`` was timed; ``op`` takes its second timestamp."""
        self._timed[graph] = op

    def before_call(self, graph: Any) -> tuple[Any, int] | None:
        """A function is about to be called in ``graph`` (``None``: eagerly): what
        :meth:`after_call` needs, or ``None`` if no fetch there was timed."""
        fetched = self._timed.get(graph) if graph is not None else None
        return None if fetched is None else (fetched, len(graph.get_operations()))

    def after_call(self, graph: Any, mark: tuple[Any, int]) -> None:
        """The call is in ``graph``: its ops start once the fetch is timed."""
        fetched, first_new_op = mark
        gate(fetched, graph.get_operations()[first_new_op:])


def gate(fetched: Any, new_ops: list[Any]) -> None:
    """The call ops just made start once the fetch before them is timed. Without this, TF may
    start a nested step function (Keras' ``one_step_on_data``) first and take the fetch's second
    timestamp only when a thread frees up, counting step time as input wait.

    The order is on the data: each input of the call that the step computed (not a resource, nor
    one of the function's captured inputs where it has others) goes through an
    ``Identity`` that waits for the timestamp, **colocated with that input**: TF inlines the call,
    so each replica's part starts once its own batch is timed, and the batch stays on its device.
    (Unplaced, the identities went to the default device: every replica's batch made a round trip
    through device 0, ~12 send/receive pairs a 4-replica tiny ``fit`` step here, an inter-device
    copy of each batch on GPUs.) A control input on the call op itself gates every op of the
    inlined body (~400 µs a tiny 4-replica step, bench/ingraph_cost.py --fit); gating only the
    first input left the other replicas free to start first, and the cached pipeline read 20-30%
    wait again. A ``control_dependencies`` block would not do either (the call's captured inputs
    are made inside it, and TF then leaves the call op out). A call with no such input gets the
    control input.

    A call inside a TPU (XLA) computation is left alone: ``TPUReplicateContext`` would pull the
    host's float64 timestamp into the computation, which a TPU cannot compile; there the step's
    work runs on the chips, so it cannot hold up the timestamp's host thread anyway."""
    import tensorflow as tf
    from tensorflow.python.framework import ops

    for op in new_ops:
        if op.type not in ("StatefulPartitionedCall", "PartitionedCall") or fetched in op.control_inputs:
            continue
        if op._get_control_flow_context() is not None:  # TPU/XLA (TF2's own control flow has none)
            continue
        data = [(i, t) for i, t in enumerate(op.inputs) if t.dtype != tf.resource]
        data = [(i, t) for i, t in data if t.op.type != "Placeholder"] or data
        if not data:
            op._add_control_input(fetched)
            continue
        for index, tensor in data:
            if tensor.op.type == "Identity" and fetched in tensor.op.control_inputs:
                continue  # already ordered
            with op.graph.as_default(), ops.colocate_with(tensor.op), tf.control_dependencies([fetched]):
                gated = tf.identity(tensor)
            op._update_input(index, gated)

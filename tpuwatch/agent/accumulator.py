"""The in-graph step accumulator, and fast reads of small variables after a step.

Figures that live inside a compiled step (input wait, fetches, examples, training ``strategy.run``
executions) are added in-graph into one host-CPU float64 variable ``[wait_s, fetches, examples,
runs]`` and read once after each top-level call: one ``assign_add`` per event in the graph, one
read per call on the host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from tpuwatch.agent.step_owner import StepOwner

# Slots of the accumulator.
WAIT_S, FETCHES, EXAMPLES, RUNS = range(4)
SLOTS = 4


def fast_reader(variables: Sequence[Any]) -> Callable[[], list[Any]]:
    """A reader of the variables' current values as numpy scalars/arrays.

    ``variable.numpy()`` goes through tape and distribution wrappers (~35 µs a variable); the
    generated op wrapper ~14 µs; TF's eager fast path for ``ReadVariableOp`` on the handle ~7 µs.
    This runs after step calls, so it matters. Falls back to the public path if the fast path is
    not there (other TF versions).
    """
    pairs = [(v.handle, v.dtype) for v in variables]
    try:
        from tensorflow.python import pywrap_tfe
        from tensorflow.python.eager import context

        fast = pywrap_tfe.TFE_Py_FastPathExecute
        ctx = context.context()
        for handle, dtype in pairs:  # fails here, not per step, if the fast path is missing
            fast(ctx, "ReadVariableOp", None, handle, "dtype", dtype).numpy()
        return lambda: [fast(ctx, "ReadVariableOp", None, handle, "dtype", dtype).numpy() for handle, dtype in pairs]
    except Exception:  # TF's private fast path moved or refuses these: the public read, slower but there
        return lambda: [v.numpy() for v in variables]


def ensure(probe: "StepOwner") -> Any:
    """The accumulator variable (created once, eagerly where possible).

    Built as a plain ``ResourceVariable`` under ``init_scope`` on the host CPU so that no
    distribution strategy mirrors it and every replica-free part of any step graph can add to it.
    """
    if probe.accumulator is None:
        import tensorflow as tf
        from tensorflow.python.ops import resource_variable_ops

        with tf.init_scope(), tf.device("/device:CPU:0"):
            probe.accumulator = resource_variable_ops.ResourceVariable(
                tf.zeros([SLOTS], tf.float64), trainable=False, name="tpuwatch_step_accumulator"
            )
        probe.acc_last = [0.0] * SLOTS
        read_one = fast_reader([probe.accumulator])
        probe.read_accumulator = lambda: read_one()[0]
    return probe.accumulator


def add_constant(probe: "StepOwner", slot: int, value: float) -> None:
    """Adds the constant ``value`` to one slot from inside a traced function (one op)."""
    import tensorflow as tf

    acc = ensure(probe)
    delta = [0.0] * SLOTS
    delta[slot] = float(value)
    with tf.device("/device:CPU:0"):
        acc.assign_add(tf.constant(delta, tf.float64))
    probe.mark("acc")


def add_vector(probe: "StepOwner", values: list[Any]) -> tuple[Any, Any]:
    """Adds ``values`` (one float64 scalar tensor per slot) from inside a traced function; returns
    the op and the vector it adds (on the host CPU)."""
    import tensorflow as tf

    acc = ensure(probe)
    with tf.device("/device:CPU:0"):
        delta = tf.stack(values)
        op = acc.assign_add(delta, read_value=False)
    probe.mark("acc")
    return op, delta

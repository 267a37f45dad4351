"""Input wait: how long each step waits for its next batch.

Keras 3 ``fit`` fetches input *inside* the compiled step (``iterator.get_next()`` /
``get_next_as_optional()`` in ``multi_step_on_iterator``), so the fetch is timed in-graph:
``tf.timestamp()`` before it (no edge: it runs as the step starts) and after it (once the batch
has arrived: a distributed batch's last replica's part, :func:`_last_replica`), and the
difference added into
the step probe's host-CPU accumulator (together with the examples fetched). The batch's
consumers start after the second timestamp (:func:`_after`, and :mod:`.fetch_order` for a
nested step function). A tf.function that fetches from a plain iterator more than once (Keras
3.3's unrolled ``steps_per_execution``, a Python loop over a call's steps) fetches each next batch
after the previous fetch's count is added: when the data runs out, the fetch that raises aborts
the call with every earlier fetch counted, and the steps handed a batch are known
(``record_cut_short``). A distributed iterator's fetch is left as built (the edge would reach
every replica's device), and so is a TPU's. Eager fetches
(``for x in dist_dataset``, ``next(iterator)``) are timed with ``perf_counter`` and charged to the
next step. Only the outermost fetch is timed: a distributed iterator's ``get_next`` calls the
per-worker iterators' ``get_next`` underneath.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable

from tpuwatch.agent import accumulator
from tpuwatch.agent.accumulator import EXAMPLES

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.patches import Patches
    from tpuwatch.agent.steps import StepProbe

PROBE = "input_wait"
HOST = "/device:CPU:0"


def _examples_in(value: Any) -> Any:
    """Batch size of a fetched element, as a tensor (summed over replicas); None if unknown."""
    import tensorflow as tf

    static = _static_examples(value)
    if static is not None:  # the usual case (TPUs need static shapes): one constant, no ops
        return tf.constant(float(static), tf.float64)
    flat = tf.nest.flatten(value)
    if not flat:
        return None
    first = flat[0]
    parts = getattr(first, "values", None)
    tensors = list(parts) if isinstance(parts, tuple) else [first]
    sizes = []
    for t in tensors:
        if not isinstance(t, (tf.Tensor, tf.Variable)) or t.shape.rank in (None, 0):
            return None
        dim = t.shape[0]
        sizes.append(tf.constant(dim, tf.float64) if dim is not None else tf.cast(tf.shape(t)[0], tf.float64))
    return tf.add_n(sizes)


def _examples_or_zero(value: Any) -> Any:
    """``_examples_in`` for a ``tf.cond`` branch: a tensor, never None (and never a Python bool
    test of a tensor, which autograph rejects inside loops over distributed datasets)."""
    import tensorflow as tf

    examples = _examples_in(value)
    return tf.constant(0.0, tf.float64) if examples is None else tf.cast(examples, tf.float64)


def _static_spec_examples(optional: Any) -> int | None:
    """The examples an Optional holds when it has a value, where its element spec fixes them
    (summed over a distributed value's replicas), else None: what :func:`_static_examples` says
    of the value, known without a ``tf.cond`` to take it out, in every step of Keras' loop with
    ``steps_per_execution`` > 1 (it fetches the next batch with ``get_next_as_optional``). Two ops
    a fetch instead of a branch; at the tiny ``steps_per_execution=8`` step of
    bench/fit_overhead.py the in-graph figure did not move beyond its noise (+13.6 µs a step
    before, +15.3 and +20.4 after). A distributed iterator over a finite dataset pads the
    replicas left without data through a ``tf.cond`` of its own, which leaves the batch dimension
    open in the spec (on any device): the branch stays there; over a repeated dataset the spec
    is static. Anything unexpected in the spec: None, and the branch."""
    import tensorflow as tf

    try:
        return _first_batch(tf.nest.flatten(optional.element_spec), "_value_specs")  # a PerReplicaSpec's
    except Exception:  # not TensorFlow's Optional, or a spec of another kind: the branch asks the value
        return None


def _static_examples(value: Any) -> int | None:
    import tensorflow as tf

    return _first_batch(tf.nest.flatten(value), "values")  # a PerReplica's


def _first_batch(flat: list[Any], parts_attr: str) -> int | None:
    """The static first dimension of the first of ``flat`` (tensors or their specs), summed over
    a distributed one's parts (its ``parts_attr``, a tuple, one a replica); None where one is
    not static."""
    if not flat:
        return None
    parts = getattr(flat[0], parts_attr, None)
    items = list(parts) if isinstance(parts, tuple) else [flat[0]]
    total = 0
    for item in items:
        shape = getattr(item, "shape", None)
        if shape is None or shape.rank in (None, 0) or shape[0] is None:
            return None
        total += int(shape[0])
    return total


class InputWaitProbe:
    def __init__(self, agent: "Agent", probe: "StepProbe") -> None:
        self.agent = agent
        self.probe = probe
        self._depth = threading.local()
        # tf.function graph -> the name of the accumulator add of its latest plain fetch: the
        # graph's next plain fetch runs after it (a name: an op would keep its graph alive)
        self._counted: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()

    def make_wrapper(self, optional: bool,
                     distributed: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            from tensorflow.python.eager import context

            executing_eagerly = context.executing_eagerly
            this = self

            def fetch(it: Any, *args: Any, **kwargs: Any) -> Any:
                depth = getattr(this._depth, "n", 0)
                if depth or not this.agent.enabled(PROBE):
                    return original(it, *args, **kwargs)
                this._depth.n = 1
                try:
                    if executing_eagerly():
                        if distributed:  # a distributed batch fetched between steps (the auto-profile asks)
                            this.probe.eager_distributed_fetches += 1
                        result = this._eager(original, optional, it, args, kwargs)
                        this._fetched(it)
                        return result
                    return this._traced(original, optional, it, args, kwargs, distributed)
                finally:
                    this._depth.n = 0

            return fetch

        return make

    def _fetched(self, it: Any) -> None:
        """The pipeline map learns where the script fetches eagerly (after the fetch is timed)."""
        pm = getattr(self.agent, "pipeline_map", None)
        if pm is not None:
            try:
                pm.fetched(it)
            except Exception as e:  # the batch is the script's: only the probe stops
                self.agent.probe_failed("pipeline_map", e)

    def _eager(self, original: Callable[..., Any], optional: bool, it: Any, args: Any, kwargs: Any) -> Any:
        probe = self.probe
        start = probe.perf()
        result = original(it, *args, **kwargs)
        probe.eager_wait_s += probe.perf() - start
        probe.eager_loop.fetched()
        if not optional:
            try:
                examples = _static_examples(result)
                if examples is not None:
                    probe.eager_examples = (probe.eager_examples or 0) + examples
            except Exception as e:
                self.agent.probe_failed("examples", e)
        return result

    def _traced(self, original: Callable[..., Any], optional: bool, it: Any, args: Any, kwargs: Any,
                distributed: bool = False) -> Any:
        try:
            import tensorflow as tf

            self.agent.inject_fault(PROBE)
            # The batch's consumers wait for the second timestamp (_after), but an Optional's
            # (never a custom loop's), a TPU's, and a Keras step's (fetch_order orders its nested
            # step function instead)
            gated = not (optional or _on_tpu(it) or _in_keras_step())
            devices = _replica_cpus(it) if gated else None
            # Where the replicas are CPUs, both timestamps and the wait are the last replica's
            # (_replica_cpus): in a tf.function TensorFlow runs its stateful ops in the order
            # they were made, so the first comes before the second, an edge within that device's
            # graph. (A batch whose parts turn out not to be one a device: the second and the
            # wait are the host's, the first stays there.)
            with tf.device(devices[-1][0] if devices else HOST):
                t0 = tf.timestamp()
        except Exception as e:
            self.agent.probe_failed(PROBE, e)
            return original(it, *args, **kwargs)
        # No control edge from t0 to the fetch: it has no inputs, so it runs as the step (or loop
        # iteration) starts, like the fetch; an edge to every replica's fetch put a cross-device
        # hop on every step's critical path. A second plain fetch in a tf.function waits for the
        # first's count (see the module's docstring); an Optional never raises.
        graph = None
        after: Any = contextlib.nullcontext()
        try:
            if not optional and not distributed and not _on_tpu(it):
                from tensorflow.python.framework.func_graph import FuncGraph

                graph = tf.compat.v1.get_default_graph()
                if not isinstance(graph, FuncGraph):
                    graph = None  # TF1 graph mode: sess.run of one fetch would pull the other
                elif graph in self._counted:
                    after = tf.control_dependencies([graph.get_operation_by_name(self._counted[graph])])
        except Exception as e:
            self.agent.probe_failed(PROBE, e)
            graph, after = None, contextlib.nullcontext()
        with after:
            result = original(it, *args, **kwargs)
        try:
            parts = _one_part_a_device(devices, result)
            t1, on_host = self._account(result, optional, t0, graph, parts[-1][0] if parts else HOST)
        except Exception as e:
            self.agent.probe_failed(PROBE, e)
            return result
        if not gated:
            return result
        try:
            return _after(result, t1, _gates(parts, t1, on_host) if parts else None)
        except Exception as e:  # the gates on t1 alone, as where the timestamp is the host's
            try:
                return _after(result, t1)
            except Exception:
                pass
            self.agent.probe_failed(PROBE, e)
            return result

    def _account(self, result: Any, optional: bool, t0: Any, graph: Any, device: str) -> tuple[Any, Any]:
        """Adds the fetch's wait, count and examples to the accumulator; returns the second
        timestamp, taken on ``device`` (the wait too, beside it), and what the accumulator adds
        (on the host, made once the wait is there). ``graph``: where a next fetch must wait for
        this one's count (None: nowhere)."""
        import tensorflow as tf

        with tf.control_dependencies(_last_replica(result)), tf.device(device):
            t1 = tf.timestamp()
        with tf.device(device):  # one value to the host, where t1 and t0 were two
            waited = t1 - t0
        values = [waited, tf.constant(1.0, tf.float64), tf.constant(0.0, tf.float64), tf.constant(0.0, tf.float64)]
        if self.agent.enabled("examples"):
            try:
                if optional:
                    static = _static_spec_examples(result)
                    if static is not None:  # Keras' loop over batches of a fixed size: no branch a fetch
                        examples = tf.cast(result.has_value(), tf.float64) * float(static)
                    else:
                        examples = tf.cond(
                            result.has_value(),
                            lambda: _examples_or_zero(result.get_value()),
                            lambda: tf.constant(0.0, tf.float64),
                        )
                else:
                    examples = _examples_in(result)
                if examples is not None:
                    values[EXAMPLES] = tf.cast(examples, tf.float64)
            except Exception as e:
                self.agent.probe_failed("examples", e)
        added, delta = accumulator.add_vector(self.probe, values)
        if graph is not None:
            self._counted[graph] = added.name
        # A tf.function called after this fetch in the same graph (Keras' step on the batch) runs
        # after the fetch is timed: TF would otherwise start that call first and take the second
        # timestamp only when a thread frees up, counting step time as input wait. Only the
        # timestamp: the accounting after it runs beside the step, off its critical path.
        self.probe.fetch_order.timed(tf.compat.v1.get_default_graph(), t1.op)
        return t1, delta


def _last_replica(result: Any) -> list[Any]:
    """The fetched tensors the second timestamp waits for: a distributed batch's last replica's
    part, all of any other batch.

    A multi-device iterator hands the host pipeline's elements to the replicas' devices in turn,
    so the last replica's part is made last and its arrival is the batch's. (The first replica's
    is not: with ``distribute_datasets_from_function`` each part is a whole element of the host
    pipeline, and waiting for the first of 4 read 9.8 % of an 87 % wait.) One edge into the
    host's timestamp instead of one from every replica's device: a send/receive pair each a step
    where the replicas' devices are not the host's."""
    import tensorflow as tf
    from tensorflow.python.distribute import values as values_lib

    waited: list[Any] = []
    for leaf in tf.nest.flatten(result):  # distributed values stay whole
        if isinstance(leaf, values_lib.DistributedValues) and leaf.values:
            leaf = leaf.values[-1]
        waited.extend(t for t in tf.nest.flatten(leaf, expand_composites=True) if isinstance(t, tf.Tensor))
    return waited


def _replica_cpus(it: Any) -> tuple[tuple[str, bool], ...] | None:
    """The devices ``it`` fetches a distributed batch's parts to, in order, each with whether it
    is the host's ``CPU:0``, where each is a CPU of this host (a MirroredStrategy over logical
    CPUs), there are several, and the parts are fetched to them; else None, as on anything
    unexpected (the host's timestamps are the fallback, never the probe turned off; a batch
    that is not one part a device takes the host's second timestamp, :func:`_one_part_a_device`). Both
    timestamps and the wait are then the last one's, beside the part the second waits for: that
    replica's gates wait for an op of its own device's graph, the other replicas' for one hop
    from it, and the wait goes to the host as one value. (TensorFlow has no timestamp op on an
    accelerator: there they stay on the host.)"""
    from tpuwatch.agent.environment import local_cpu_replicas

    strategy = getattr(it, "_strategy", None)
    if strategy is None:
        return None
    options = getattr(it, "_options", None)
    if options is not None and not getattr(options, "experimental_fetch_to_device", True):
        return None  # the parts stay on the host (InputOptions): so do the timestamps
    return local_cpu_replicas(strategy)


def _one_part_a_device(devices: tuple[tuple[str, bool], ...] | None,
                       result: Any) -> tuple[tuple[str, bool], ...] | None:
    """``devices`` (of :func:`_replica_cpus`) where every distributed value of the fetched batch
    has one part for each of them, else None."""
    if not devices:
        return None
    try:
        import tensorflow as tf
        from tensorflow.python.distribute import values as values_lib

        fits = all(len(leaf.values) == len(devices) for leaf in tf.nest.flatten(result)  # distributed values stay whole
                   if isinstance(leaf, values_lib.DistributedValues))
    except Exception:
        return None
    return devices if fits else None


def _gates(parts: tuple[tuple[str, bool], ...], t1: Any, on_host: Any) -> list[Any]:
    """What each replica's part waits for: the second timestamp, or on the host's CPU:0 what the
    accumulator adds, made there from the wait and the examples (after the same moment: the
    examples of a batch whose size is not static are counted from parts made before the last;
    with no second edge into that device)."""
    return [on_host if host else t1 for _, host in parts]


def _on_tpu(it: Any) -> bool:
    """A TPUStrategy's iterator (or any iterator while a TPUStrategy is current): its batch goes
    into an XLA computation, left as TF builds it (the gate in :mod:`.fetch_order` leaves TPU
    computations alone too); the work on the chips cannot hold up the host's timestamp."""
    from tensorflow.python.distribute import distribute_lib

    from tpuwatch.agent.environment import is_tpu_strategy

    strategy = getattr(it, "_strategy", None)
    if strategy is not None and is_tpu_strategy(strategy):
        return True
    return distribute_lib.has_strategy() and is_tpu_strategy(distribute_lib.get_strategy())


#: Keras' step functions: their fetch feeds a nested tf.function that :mod:`.fetch_order` gates.
#: Gating their batch here as well made the iterator of fit's validation take 30 s to finish at
#: the epoch boundary (phases_fit.py, 2 of 2 runs; TF's autotune join, plain runs see it too).
_KERAS_STEP_FUNCTIONS = ("multi_step_on_iterator", "one_step_on_iterator")


def _in_keras_step() -> bool:
    """The fetch is traced inside a Keras step function (any graph around it)."""
    import tensorflow as tf

    graph: Any = tf.compat.v1.get_default_graph()
    for _ in range(32):  # a bounded walk out through nested functions and loop bodies
        if graph is None:
            return False
        if any(name in getattr(graph, "name", "") for name in _KERAS_STEP_FUNCTIONS):
            return True
        graph = getattr(graph, "outer_graph", None)
    return False


def _after(result: Any, t1: Any, by_replica: list[Any] | None = None) -> Any:
    """The fetched batch as its consumers get it: each tensor through an ``Identity`` that waits
    for the second timestamp (``by_replica``: a distributed batch's parts each for what
    :func:`_gates` gives), colocated with the tensor (no copy, no device hop). The ops of a
    custom loop's step (``strategy.run(step_fn, args=(next(it),))``, no nested tf.function to
    gate) then start once the fetch is timed; without it, one replica's step began as soon as
    its own part arrived and the timestamp waited for a free thread behind it: a cached pipeline
    read 33-35 % wait on 22 ms steps whose fetch costs ~0.9 ms (2 logical CPUs)."""
    import tensorflow as tf
    from tensorflow.python.distribute import values as values_lib
    from tensorflow.python.framework import ops

    def gated(value: Any, gate: Any) -> Any:
        if not isinstance(value, tf.Tensor):
            return value
        with ops.colocate_with(value.op), tf.control_dependencies([gate]):
            return tf.identity(value)

    def leaf_after(leaf: Any) -> Any:
        if by_replica is not None and isinstance(leaf, values_lib.DistributedValues):
            flat = tf.nest.flatten(leaf, expand_composites=True)  # the parts' tensors, part by part
            per, rest = divmod(len(flat), len(by_replica))
            if per and not rest:
                return tf.nest.pack_sequence_as(
                    leaf, [gated(v, by_replica[i // per]) for i, v in enumerate(flat)], expand_composites=True)
        return tf.nest.map_structure(lambda v: gated(v, t1), leaf, expand_composites=True)

    return tf.nest.pack_sequence_as(result, [leaf_after(leaf) for leaf in tf.nest.flatten(result)])


def install(agent: "Agent", patches: "Patches", probe: "StepProbe") -> InputWaitProbe:
    from tensorflow.python.data.ops import iterator_ops
    from tensorflow.python.distribute import input_lib

    iw = InputWaitProbe(agent, probe)

    def prepare() -> None:
        try:
            accumulator.ensure(probe)
        except Exception as e:
            agent.probe_failed(PROBE, e)

    probe.before_first_call.append(prepare)
    # Distributed iterators (experimental_distribute_dataset / distribute_datasets_from_function).
    patches.wrap(input_lib.DistributedIteratorBase, "get_next", iw.make_wrapper(optional=False, distributed=True))
    patches.wrap(input_lib.DistributedIteratorBase, "get_next_as_optional",
                 iw.make_wrapper(optional=True, distributed=True))
    # Plain tf.data iterators (iter(dataset), the default strategy, per-worker iterators).
    patches.wrap(iterator_ops.OwnedIterator, "_next_internal", iw.make_wrapper(optional=False))
    patches.wrap(iterator_ops.OwnedIterator, "get_next_as_optional", iw.make_wrapper(optional=True))
    return iw


"""Per-replica loss, and ``strategy.run`` as a step boundary.

Which value is a replica's loss: in every training loop it is the target of
``GradientTape.gradient`` in that replica, so that is what is captured — unless Keras computed it
(``Trainer._compute_loss`` from Keras 3.5, ``Trainer.compute_loss`` before; tf_keras'
compiled loss, ``LossesContainer.__call__``), in which case Keras' own value, unscaled the way Keras' loss tracker
unscales it, is taken (the gradient target there may carry loss scaling). A gradient target that
a loss-scale optimizer made (mixed precision: Keras 3's ``scale_loss``, tf_keras'
``get_scaled_loss``) is the loss times the scale: the loss it was made from is taken.

Where it is kept:
- traced (inside a tf.function): assigned into a variable with ``synchronization=ON_READ,
  aggregation=NONE`` made in cross-replica context, then read per replica after the step;
- traced, where the replicas are this host's CPUs (a MirroredStrategy over logical CPUs) and the
  function's own ``strategy.run`` returns each replica's loss to a ``strategy.reduce``:
  stacked into one host variable from the copies the reduction makes on the host (one write and
  no transfer a step; the per-replica variable took a write and an input a replica). The losses
  wait in ``_pending`` until the run's result or the reduction says which; a run whose replicas
  did not return their losses writes them per replica as it returns. Returned losses that no
  reduction takes are stacked on the host as the function ends: free where the function returns
  them (here its outputs came to the host), a transfer a replica where it drops them;
- eager: the value is kept directly.

What it means: the tutorials' custom loops scale each replica's loss by ``1/global batch``
(``tf.nn.compute_average_loss``, ``tf.nn.scale_regularization_loss``) and reduce with
``strategy.reduce(SUM, ...)``; others take each replica's mean and reduce with MEAN. Each replica
is shown with its own mean loss (the scaled value times the replicas in sync), and the run's loss
is the mean of those, which is exactly what the script's own reduction gives in both cases. Which
case applies is learned while the step is traced: a SUM or MEAN ``strategy.reduce`` of the
captured loss says it directly; else a call of ``compute_average_loss`` or
``scale_regularization_loss`` in the replica means SUM; else MEAN.

``strategy.run`` is patched on every strategy class that implements it, without changing the
function it is given (a tf.function must stay a tf.function: ``mirrored_run`` lifts only those out
of the caller's graph, and ``TPUStrategy`` requires one when called eagerly). Each traced
execution whose replicas computed gradients adds one to the in-graph step count; evaluation and
prediction runs add nothing.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable

from tpuwatch.agent import accumulator
from tpuwatch.agent.environment import local_cpu_replicas
from tpuwatch.agent.steps import _initialising_wrapper, current_graph

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.patches import Patches
    from tpuwatch.agent.steps import StepProbe

PROBE = "replica_loss"

SUM, MEAN = "sum", "mean"


class LossSlot:
    """One ON_READ variable per strategy, holding each local replica's last loss."""

    def __init__(self, strategy: Any) -> None:
        import tensorflow as tf

        with tf.init_scope(), strategy.scope():
            self.var = tf.Variable(
                0.0,
                dtype=tf.float32,
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.NONE,
                name="tpuwatch_replica_loss",
            )
        self.replicas = int(strategy.num_replicas_in_sync)
        self.components = tuple(strategy.experimental_local_results(self.var))
        self._read = accumulator.fast_reader(self.components)
        # Where the replicas are this host's CPUs (its strategy.reduce copies each replica's value
        # to the host's CPU, where a stack of the same tensors reuses the copy), a step that hands its losses to
        # strategy.reduce keeps them here instead, stacked on the host (see ReplicaLossProbe.reduced).
        self.host: Any = None
        self._read_host: Callable[[], list[Any]] | None = None
        if len(self.components) > 1 and local_cpu_replicas(strategy) is not None:
            from tensorflow.python.ops import resource_variable_ops

            with tf.init_scope(), tf.device(HOST):
                self.host = resource_variable_ops.ResourceVariable(
                    tf.zeros([len(self.components)], tf.float32), trainable=False, name="tpuwatch_replica_losses")
            self._read_host = accumulator.fast_reader([self.host])

    def read(self, on_host: bool = False) -> tuple[float, ...]:
        if on_host and self._read_host is not None:
            return tuple(float(v) for v in self._read_host()[0])
        return tuple(float(v) for v in self._read())


HOST = "/device:CPU:0"


def _static_replica_id(ctx: Any) -> int | None:
    """The replica's index in its strategy's sync group, where the trace knows it, else None."""
    import tensorflow as tf

    known = getattr(ctx, "_replica_id_in_sync_group", None)  # the int the public tensor is made of
    if isinstance(known, int):
        return known
    try:
        rid = tf.get_static_value(ctx.replica_id_in_sync_group)
        return None if rid is None else int(rid)
    except Exception:  # not a tensor TensorFlow can fold
        return None


def _first_float(value: Any) -> Any:
    """``value`` if it is a floating tensor, else the first floating tensor in its structure."""
    import tensorflow as tf

    for item in tf.nest.flatten(value):
        dtype = getattr(item, "dtype", None)
        if dtype is not None and getattr(dtype, "is_floating", False) and hasattr(item, "shape"):
            return item
    return None


def _reduce_kind(reduce_op: Any) -> str | None:
    name = str(getattr(reduce_op, "value", reduce_op)).upper()
    if name.endswith("SUM"):
        return SUM
    if name.endswith("MEAN"):
        return MEAN
    return None


def scale_for(flags: dict[str, Any], replicas: int) -> float:
    """What a captured per-replica value is multiplied by to give that replica's own mean loss."""
    kind = flags.get("loss_reduce") or (SUM if flags.get("loss_scaled") else MEAN)
    return float(replicas) if kind == SUM and replicas > 1 else 1.0


class ReplicaLossProbe:
    def __init__(self, agent: "Agent", probe: "StepProbe", announce: Callable[[Any], None] | None) -> None:
        self.agent = agent
        self.probe = probe
        self.announce = announce
        self._slots: dict[int, LossSlot] = {}
        self.strategies: weakref.WeakSet[Any] = weakref.WeakSet()  # made so far (see prepare)
        # Per thread (MirroredStrategy runs each replica on its own thread while tracing):
        # keras_loss = (graph, tensor) computed by Keras and not yet used by a gradient;
        # scaled = compute_average_loss/scale_regularization_loss ran since the last gradient;
        # captured = graphs in which this replica's loss was already kept (the first one wins).
        self._local = threading.local()
        self._in_run = threading.local()
        # The loss tensors captured while tracing, to recognise them in strategy.reduce.
        self._captured: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
        # Graph -> {replica id: (slot, loss)}: losses kept but not yet written (see ran); graph ->
        # strategy.runs being traced in it; graphs whose losses wait for a strategy.reduce.
        self._pending: "weakref.WeakKeyDictionary[Any, dict[int, tuple[LossSlot, Any]]]" = weakref.WeakKeyDictionary()
        self._runs: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
        self._awaiting: "weakref.WeakSet[Any]" = weakref.WeakSet()
        # Loss-scaled tensors (id -> the scaled tensor, id -> the loss it was made from).
        self._scaled: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
        self._unscaled: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
        probe.loss_reader = self.read_for
        probe.eager_function.loss_reader = self.read_eager_function
        probe.gradient_hooks.append(self.on_gradient)

    # --- reading (training thread, after a step call) ---------------------------------------

    def read_for(self, flags: dict[str, Any]) -> tuple[float, ...] | None:
        """Each local replica's loss after a call of the function with these flags."""
        slot = flags.get("loss")
        if slot is None or not self.agent.enabled(PROBE):
            return None
        try:
            scale = scale_for(flags, slot.replicas)
            return tuple(v * scale for v in slot.read(flags.get("loss_on_host", False)))
        except Exception as e:
            self.agent.probe_failed(PROBE, e)
            return None

    def eager_losses(self) -> tuple[float, ...] | None:
        """Each replica's loss after a top-level eager strategy.run (None if none was kept)."""
        probe = self.probe
        flags = probe.strategy_run.flags
        if probe.eager_losses:
            return self._kept_eagerly(flags)
        slot = flags.get("loss")  # the run called a tf.function that keeps the loss in-graph
        if slot is None:
            return None
        return tuple(v * scale_for(flags, slot.replicas) for v in slot.read())

    def read_eager_function(self, flags: dict[str, Any]) -> tuple[float, ...] | None:
        """Each replica's loss after a call of a function that ran eagerly
        (``tf.config.run_functions_eagerly``): kept as values while it ran."""
        if not self.probe.eager_losses or not self.agent.enabled(PROBE):
            return None
        return self._kept_eagerly(flags)

    def _kept_eagerly(self, flags: dict[str, Any]) -> tuple[float, ...]:
        losses = self.probe.eager_losses
        strategy = flags.get("strategy")
        replicas = int(getattr(strategy, "num_replicas_in_sync", len(losses)) or 1)
        scale = scale_for(flags, replicas)
        return tuple(v * scale for _, (_, v) in sorted(losses.items()))

    # --- capturing (replica context) ----------------------------------------------------------

    def slot_for(self, strategy: Any) -> LossSlot:
        slot = self._slots.get(id(strategy))
        if slot is None:
            slot = self._slots[id(strategy)] = LossSlot(strategy)
        return slot

    def prepare(self) -> None:
        """Makes the loss variables of the strategies seen so far, eagerly, before a function's
        first trace: a ``tf.Variable`` made *during* a trace makes TF trace that function a
        second time (its no-variable-creation retrace), doubling the user's compile time.

        Inside a strategy's scope only that strategy can be entered; a slot that cannot be made
        here is made at its first trace instead (the fallback costs that retrace, nothing else).
        """
        import tensorflow as tf

        if not self.agent.enabled(PROBE):
            return
        current = tf.distribute.get_strategy()
        candidates = [current] if tf.distribute.has_strategy() else [*self.strategies, current]
        for strategy in candidates:
            if id(strategy) in self._slots:
                continue
            try:
                self.slot_for(strategy)
            except Exception as e:
                self.agent.event("debug", f"probe:{PROBE}", f"loss variable for {type(strategy).__name__} "
                                 f"deferred to its first trace: {type(e).__name__}: {e}")

    def on_gradient(self, target: Any, of_variables: bool = True) -> None:
        """``tape.gradient(target, ...)`` is being called: keep this replica's loss (a gradient
        with respect to variables is the loss over one with respect to tensors only, an FGSM
        perturbation's, taken before it)."""
        local = self._local
        keras = getattr(local, "keras_loss", None)
        scaled = getattr(local, "scaled", False)
        local.keras_loss = None
        local.scaled = False
        if not self.agent.enabled(PROBE):
            return
        try:
            graph = current_graph()
            if keras is not None and keras[0] is graph:
                self.capture(keras[1], graph, keras_value=True, of_variables=of_variables)
            else:
                self.capture(self.unscaled(_first_float(target)), graph, scaled=scaled, of_variables=of_variables)
        except Exception as e:
            self.agent.probe_failed(PROBE, e)

    def capture(self, loss: Any, graph: Any, *, scaled: bool = False, keras_value: bool = False,
                of_variables: bool = True) -> None:
        """Keeps ``loss`` as the current replica's loss (replica context; the first one per graph,
        or the first of a gradient with respect to variables after ones that were not)."""
        if loss is None:
            return
        import tensorflow as tf

        self.agent.inject_fault(PROBE)
        probe = self.probe
        if graph is None and not probe.strategy_run.depth and not probe.eager_function.active:
            # A loop with no tf.function (inside a strategy's scope too): its first gradient's loss
            # (inside a tpuwatch.step(), the script gives its own).
            loop = probe.eager_loop
            if probe.trace.current_top is None and (loop.loss is None or (of_variables and not loop.loss_of_variables)):
                loop.loss = loss
                loop.loss_of_variables = of_variables
            return
        ctx = tf.distribute.get_replica_context()
        if ctx is None:  # cross-replica context: not a replica's loss
            return
        if graph is None:
            # An eager strategy.run, or a tf.function run eagerly (tf.config.run_functions_eagerly):
            # each replica's loss kept as a value, the first of its step (a loop inside the
            # function: the last step's), of variables over tensors only.
            rid = int(ctx.replica_id_in_sync_group)
            rank = (probe.eager_function.step_index() if probe.eager_function.active else 0, of_variables)
            kept = probe.eager_losses.get(rid)
            if kept is None or rank > kept[0]:
                probe.eager_losses[rid] = (rank, float(tf.reduce_mean(tf.cast(loss, tf.float32)).numpy()))
                self._captured[id(loss)] = loss
                if probe.strategy_run.depth:
                    probe.strategy_run.flags["loss_scaled"] = scaled and not keras_value
                else:
                    probe.trace.mark("loss_scaled", scaled and not keras_value)
                    if keras_value:
                        probe.trace.mark("loss_reduce", MEAN)
            return
        done = getattr(self._local, "captured", None)
        if done is None:
            done = self._local.captured = weakref.WeakKeyDictionary()  # graph -> of variables
        if graph in done and (done[graph] or not of_variables):
            return
        slot = self._slots.get(id(ctx.strategy))
        if slot is None:  # made in cross-replica context by the strategy.run wrapper or prepare
            return
        value = loss if loss.shape.rank == 0 else tf.reduce_mean(loss)
        replica = _static_replica_id(ctx) if slot.host is not None and graph in self._runs else None
        if replica is not None and getattr(graph, "experimental_acd_manager", None) is not None:
            # Written once it is known where: see ran.
            self._pending.setdefault(graph, {})[replica] = (slot, value)
        else:
            slot.var.assign(tf.cast(value, tf.float32))  # a later assign in the graph runs later
        done[graph] = of_variables
        self._captured[id(loss)] = loss
        probe.trace.mark("loss", slot)
        probe.trace.mark("loss_scaled", scaled and not keras_value)
        if keras_value:
            probe.trace.mark("loss_reduce", MEAN)  # Keras logs the mean over replicas

    def note_loss_scaled(self, loss: Any, scaled: Any) -> None:
        """A loss-scale optimizer made ``scaled`` from ``loss`` (mixed precision)."""
        if scaled is loss or loss is None:
            return
        try:
            self._scaled[id(scaled)] = scaled
            self._unscaled[id(scaled)] = loss
        except TypeError:  # not weak-referenceable: the gradient target is taken as it is
            pass

    def unscaled(self, target: Any) -> Any:
        """The loss a loss-scaled gradient target was made from (else the target itself)."""
        if target is not None and self._scaled.get(id(target)) is target:
            loss = self._unscaled.get(id(target))
            if loss is not None:
                return _first_float(loss)
        return target

    def note_scaled(self) -> None:
        """compute_average_loss / scale_regularization_loss ran in this replica."""
        self._local.scaled = True

    def keep_keras_loss(self, loss: Any) -> None:
        """Keras computed this replica's training loss (used by the next gradient call)."""
        self._local.keras_loss = (current_graph(), loss)

    # --- strategy.run and strategy.reduce ------------------------------------------------------

    def make_run_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        from tensorflow.python.eager import context

        executing_eagerly = context.executing_eagerly
        this = self
        agent = self.agent

        def run(strategy: Any, fn: Any, args: Any = (), kwargs: Any = None, options: Any = None) -> Any:
            # OneDeviceStrategy.run calls StrategyBase.run: only the outermost call counts.
            if getattr(this._in_run, "active", False) or not agent.enabled("steps"):
                return original(strategy, fn, args, kwargs, options)
            this._in_run.active = True
            try:
                return this._run(original, strategy, fn, args, kwargs, options, executing_eagerly())
            finally:
                this._in_run.active = False

        return run

    def _run(self, original: Callable[..., Any], strategy: Any, fn: Any, args: Any, kwargs: Any, options: Any,
             eager: bool) -> Any:
        probe, agent = self.probe, self.agent
        try:
            if self.announce is not None:
                self.announce(strategy)
            if agent.enabled(PROBE) and (not eager or (probe.trace.current_top is None and not probe.strategy_run.depth)):
                self.slot_for(strategy)  # variables can only be made in cross-replica context
        except Exception as e:
            agent.probe_failed(PROBE, e)
        if not eager:
            marks = probe.trace.training_marks
            graph = current_graph()
            runs = self._runs
            runs[graph] = runs.get(graph, 0) + 1
            try:
                result = original(strategy, fn, args, kwargs, options)
            except BaseException:
                self.dropped(graph)
                raise
            finally:
                runs[graph] -= 1
                if not runs[graph]:
                    del runs[graph]
            if self._pending:
                try:
                    self.ran(graph, result)
                except Exception as e:
                    agent.probe_failed(PROBE, e)
            if probe.trace.training_marks != marks:  # its replicas computed gradients: a training step
                try:
                    probe.count_training_runs(current_graph())
                    probe.trace.mark("strategy", strategy)
                except Exception as e:
                    agent.probe_failed("steps", e)
            return result
        if probe.eager_function.active:
            # Inside a tf.function that runs eagerly (tf.config.run_functions_eagerly): a training
            # step of that call if its replicas compute gradients, with their losses.
            marks = probe.trace.training_marks
            kept, probe.eager_losses = probe.eager_losses, {}
            try:
                result = original(strategy, fn, args, kwargs, options)
            finally:
                try:
                    if probe.trace.training_marks != marks:
                        probe.eager_function.runs += 1
                        probe.trace.mark("strategy", strategy)
                    else:
                        probe.eager_losses = kept
                except Exception as e:
                    agent.probe_failed("steps", e)
            return result
        if probe.trace.current_top is not None or probe.strategy_run.depth:
            return original(strategy, fn, args, kwargs, options)
        # A top-level eager strategy.run: a step if its replicas compute gradients.

        def read_losses() -> tuple[float, ...] | None:
            try:
                return self.eager_losses() if agent.enabled(PROBE) else None
            except Exception as e:  # a probe never raises into the script
                agent.probe_failed(PROBE, e)
                return None

        return probe.strategy_run.step(lambda: original(strategy, fn, args, kwargs, options), strategy, read_losses)

    def make_reduce_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        this = self

        def reduce(strategy: Any, reduce_op: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                if this._captured and this.agent.enabled(PROBE) and (
                        current_graph() is not None or this.probe.eager_function.active):
                    kind = _reduce_kind(reduce_op)
                    if kind is not None:
                        for part in strategy.experimental_local_results(value):
                            if this._captured.get(id(part)) is part:
                                this.probe.trace.mark("loss_reduce", kind)
                                break
                if this._pending:
                    this.reduced(strategy, value)
            except Exception as e:
                this.agent.probe_failed(PROBE, e)
            return original(strategy, reduce_op, value, *args, **kwargs)

        return reduce

    def ran(self, graph: Any, result: Any) -> None:
        """A ``strategy.run`` traced in ``graph`` returned ``result``. Where every replica's loss
        kept in it is also what that replica returned, it waits for a ``strategy.reduce`` of
        them (:meth:`reduced`), with the host's variable taken into the graph now (a variable
        first used after the function's body ended would be an input TensorFlow does not pass).
        Otherwise the losses are written now, beside each replica, as a capture inside the
        replica writes them."""
        import tensorflow as tf
        from tensorflow.python.distribute import values as values_lib
        from tensorflow.python.framework.func_graph import FuncGraph

        pending = self._pending.get(graph)
        if not pending or graph in self._awaiting:
            return
        slot = next(iter(pending.values()))[0]
        returned: list[set[int]] = [set() for _ in slot.components]
        for leaf in tf.nest.flatten(result):  # distributed values stay whole
            parts = leaf.values if isinstance(leaf, values_lib.DistributedValues) else ()
            if len(parts) == len(returned):
                for i, part in enumerate(parts):
                    returned[i].add(id(part))
        # Only a top-level function's own graph (as steps.count_training_runs tells it, TF's
        # initialising wrapper included, whose trace every later call runs): a loop's body, a
        # branch or a nested function keeps the writes beside each replica.
        outer = getattr(graph, "outer_graph", None)
        top = isinstance(graph, FuncGraph) and not getattr(graph, "is_control_flow_graph", False) and (
            not getattr(outer, "building_function", False) or _initialising_wrapper(outer))
        if top and len(pending) == len(returned) and all(id(loss) in returned[i] for i, (_, loss) in pending.items()):
            graph.capture(slot.host.handle)
            self._awaiting.add(graph)
            return
        del self._pending[graph]
        for rid, (kept_in, loss) in sorted(pending.items()):
            component = kept_in.components[rid]
            with tf.device(component.device):
                component.assign(tf.cast(loss, tf.float32), read_value=False)
        self.probe.trace.mark("loss_on_host", False)

    def reduced(self, strategy: Any, value: Any) -> None:
        """``strategy.reduce`` of ``value`` is being traced: where its parts are the losses this
        graph kept for every replica (the tutorials' ``strategy.reduce(SUM, strategy.run(...))``),
        they are written stacked on the host, from the copies the reduction makes there: one
        write and no transfer a step, where one write a replica took a variable each."""
        graph = current_graph()
        if graph not in self._awaiting:
            return
        parts = strategy.experimental_local_results(value)
        pending = self._pending.get(graph) or {}
        if len(parts) != len(pending) or any(pending.get(i, (None, None))[1] is not p for i, p in enumerate(parts)):
            return
        self.written(graph)

    def dropped(self, graph: Any) -> None:
        """A trace of ``graph`` raised: what it kept is let go (it holds the graph's tensors)."""
        if graph is not None:
            self._pending.pop(graph, None)
            self._awaiting.discard(graph)

    def written(self, graph: Any) -> None:
        """The losses ``graph`` keeps for a reduction are written, stacked on the host: as the
        reduction is traced, or as the function ends if none took them (a step that returns its
        replicas' losses: TensorFlow brings its outputs to the host; one that drops them pays a
        transfer a replica)."""
        import tensorflow as tf

        if graph is None or graph not in self._awaiting:
            return
        self._awaiting.discard(graph)
        pending = self._pending.pop(graph, None)
        if not pending:
            return
        slot = next(iter(pending.values()))[0]
        with tf.device(HOST):
            slot.host.assign(tf.stack([tf.cast(loss, tf.float32) for _, (_, loss) in sorted(pending.items())]),
                             read_value=False)
        self.probe.trace.mark("loss_on_host", True)

    # --- Keras --------------------------------------------------------------------------------

    def make_compute_loss_wrapper(self, original: Callable[..., Any],
                                  unscale: Callable[..., Any] | None) -> Callable[..., Any]:
        this = self

        def compute_loss(model: Any, *args: Any, **kwargs: Any) -> Any:
            loss = original(model, *args, **kwargs)
            if loss is None or kwargs.get("training", True) is False or not this.agent.enabled(PROBE):
                return loss  # a disabled probe adds no op to the step (the unscale below is two)
            try:
                this.keep_keras_loss(unscale(loss) if unscale is not None else loss)
            except Exception as e:
                this.agent.probe_failed(PROBE, e)
            return loss

        return compute_loss

    def make_loss_scale_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``optimizer.scale_loss(loss)`` / ``get_scaled_loss(loss)``: remember what it scaled."""
        this = self

        def scale(optimizer: Any, loss: Any, *args: Any, **kwargs: Any) -> Any:
            scaled = original(optimizer, loss, *args, **kwargs)
            if this.agent.enabled(PROBE):
                try:
                    this.note_loss_scaled(loss, scaled)
                except Exception as e:
                    this.agent.probe_failed(PROBE, e)
            return scaled

        return scale

    def make_scaling_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        this = self

        def scaling(*args: Any, **kwargs: Any) -> Any:
            try:
                this.note_scaled()
            except Exception as e:
                this.agent.probe_failed(PROBE, e)
            return original(*args, **kwargs)

        return scaling


def install(agent: "Agent", patches: "Patches", probe: "StepProbe",
            announce: Callable[[Any], None] | None = None) -> ReplicaLossProbe:
    from tensorflow.python.distribute import distribute_lib

    rl = ReplicaLossProbe(agent, probe, announce)
    probe.before_first_call.append(rl.prepare)
    patches.wrap(distribute_lib.StrategyBase, "run", rl.make_run_wrapper)
    patches.wrap(distribute_lib.StrategyBase, "reduce", rl.make_reduce_wrapper)

    def make_init(original: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(strategy: Any, *args: Any, **kwargs: Any) -> None:
            original(strategy, *args, **kwargs)
            try:
                rl.strategies.add(strategy)
            except TypeError:  # not weak-referenceable: its slot is made at its first trace
                pass

        return __init__

    patches.wrap(distribute_lib.StrategyBase, "__init__", make_init)
    from tensorflow.python.framework import auto_control_deps

    def make_exit(original: Callable[..., Any]) -> Callable[..., Any]:
        # A graph's automatic control dependencies are worked out as its function ends: the losses
        # it kept and no reduction took are written just before, so that they run with the step.
        def __exit__(acd: Any, kind: Any, value: Any, tb: Any) -> Any:
            if rl._pending:
                try:
                    if kind is None:
                        rl.written(getattr(acd, "_graph", None))
                    else:  # the trace failed: nothing of it runs
                        rl.dropped(getattr(acd, "_graph", None))
                except Exception as e:
                    agent.probe_failed(PROBE, e)
            return original(acd, kind, value, tb)

        return __exit__

    patches.wrap(auto_control_deps.AutomaticControlDependencies, "__exit__", make_exit)
    # Strategies that override run(): patch them too (each class's own definition only).
    for module_name, class_names in (
        ("tensorflow.python.distribute.tpu_strategy", ("TPUStrategyV2", "TPUStrategy", "TPUStrategyV1")),
        ("tensorflow.python.distribute.one_device_strategy", ("OneDeviceStrategy",)),
    ):
        try:
            module = __import__(module_name, fromlist=["_"])
        except ImportError as e:
            agent.event("info", f"probe:{PROBE}", f"{module_name} not importable ({e}); its strategies are not patched")
            continue
        for name in class_names:
            cls = getattr(module, name, None)
            if cls is not None and "run" in vars(cls):
                patches.wrap(cls, "run", rl.make_run_wrapper)
    _install_scaling(patches, rl)
    _install_keras(agent, patches, rl)
    _install_loss_scale(agent, patches, rl)
    return rl


def _install_scaling(patches: "Patches", rl: ReplicaLossProbe) -> None:
    """``tf.nn.compute_average_loss`` / ``scale_regularization_loss``: where they are defined and
    where the public ``tf.nn`` namespace holds them (it keeps its own reference)."""
    import tensorflow as tf
    from tensorflow.python.ops import nn_impl

    for owner in (nn_impl, tf.nn):
        for name in ("compute_average_loss", "scale_regularization_loss"):
            if getattr(owner, name, None) is not None:
                patches.wrap(owner, name, rl.make_scaling_wrapper)


#: Where loss-scale optimizers scale a loss (mixed precision), and with what method: Keras 3
#: (``BaseOptimizer.scale_loss`` applies an optional ``loss_scale_factor``) and tf_keras.
LOSS_SCALE_METHODS = (
    ("keras.src.optimizers.base_optimizer", ("BaseOptimizer",), "scale_loss"),
    ("keras.src.optimizers.loss_scale_optimizer", ("LossScaleOptimizer",), "scale_loss"),
    ("tf_keras.src.mixed_precision.loss_scale_optimizer",
     ("BaseLossScaleOptimizer", "LossScaleOptimizer", "LossScaleOptimizerV3"), "get_scaled_loss"),
)


def _install_loss_scale(agent: "Agent", patches: "Patches", rl: ReplicaLossProbe) -> None:
    """Patches each class's own loss-scaling method when the script imports its module (never
    importing Keras or tf_keras for it)."""
    from tpuwatch.agent import post_import

    def patcher(class_names: tuple[str, ...], method: str) -> Callable[[Any], None]:
        def patch(module: Any) -> None:
            for name in class_names:
                cls = getattr(module, name, None)
                if cls is not None and method in vars(cls):
                    patches.wrap(cls, method, rl.make_loss_scale_wrapper)

        return patch

    for module, class_names, method in LOSS_SCALE_METHODS:
        post_import.when_imported(module, patcher(class_names, method), lambda e: agent.probe_failed(PROBE, e))


def _unscale_tf_keras(loss: Any) -> Any:
    """tf_keras' compiled loss divides each replica's loss by the replicas in sync (losses_utils.
    scale_loss_for_distribution); its loss metric, like ours, is the unscaled value."""
    import tensorflow as tf

    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return loss * replicas if replicas > 1 else loss


def _install_keras(agent: "Agent", patches: "Patches", rl: ReplicaLossProbe) -> None:
    """Keras 3's per-replica loss (only if Keras 3 is importable; legacy tf_keras below).

    Keras 3.5+ calls ``Trainer._compute_loss`` (which calls a user's ``compute_loss`` override);
    Keras 3.0-3.4 call ``compute_loss`` directly, with no distribution scaling to undo.
    """
    # When the script's Keras has loaded its trainer, never importing Keras here: TF's probes
    # install as TF is imported, and a script that imports keras first imports TF from inside
    # keras' own import; importing keras' modules then failed on the half-made keras.src.backend
    # ("cannot import name 'cast'") and fit's losses fell back to the gradient target.
    from tpuwatch.agent import post_import

    def patch_keras(keras_trainer: Any) -> None:
        from keras.src.losses import loss as keras_loss

        unscale = getattr(keras_loss, "unscale_loss_for_distribution", None)
        name = "_compute_loss" if "_compute_loss" in vars(keras_trainer.Trainer) else "compute_loss"
        patches.wrap(keras_trainer.Trainer, name, lambda orig: rl.make_compute_loss_wrapper(orig, unscale))

    post_import.when_imported("keras.src.trainers.trainer", patch_keras,
                              lambda e: agent.event("info", f"probe:{PROBE}", "Keras 3 loss hook not installed "
                                                    f"({type(e).__name__}: {e}); using the gradient target"))
    # Legacy Keras 2 (tf_keras), when the script imports it (with TF_USE_LEGACY_KERAS=1 or directly):
    # its compiled loss, which Model.compute_loss calls and an overridden train_step may call itself.

    def patch_tf_keras(compile_utils: Any) -> None:
        patches.wrap(compile_utils.LossesContainer, "__call__",
                     lambda orig: rl.make_compute_loss_wrapper(orig, _unscale_tf_keras))

    post_import.when_imported("tf_keras.src.engine.compile_utils", patch_tf_keras,
                              lambda e: agent.event("info", f"probe:{PROBE}", f"tf_keras loss hook not installed "
                                                                              f"({type(e).__name__}: {e})"))

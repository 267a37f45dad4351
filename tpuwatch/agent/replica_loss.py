"""Per-replica loss, and ``strategy.run`` as a step boundary.

``strategy.run`` is patched on every strategy class that implements it (``StrategyBase``, the
TPU strategies, ``OneDeviceStrategy``). The replica function is wrapped so that each replica's
loss is kept:

- traced (inside a tf.function): assigned into a variable with ``synchronization=ON_READ,
  aggregation=NONE`` made in cross-replica context, then read per replica after the step;
- eager: the local results are kept directly.

Which value is the loss: Keras' own ``Trainer._compute_loss`` when it runs (the instantaneous
per-replica loss, unscaled the way Keras' loss tracker unscales it); otherwise the replica
function's output entry named like "loss", else its first floating scalar.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable

from tpuwatch.agent.input_wait import RUNS, add_in_graph

if TYPE_CHECKING:
    from tpuwatch.agent.runtime import Agent
    from tpuwatch.agent.steps import StepProbe

PROBE = "replica_loss"


class LossSlot:
    """One ON_READ variable per strategy, holding each local replica's last loss."""

    def __init__(self, strategy) -> None:
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
        self.components = tuple(strategy.experimental_local_results(self.var))
        self._read = raw_reader(self.components)

    def read(self) -> tuple[float, ...]:
        return tuple(float(v) for v in self._read())


def raw_reader(variables) -> Callable[[], list]:
    """A reader of the variables' current values as numpy scalars/arrays.

    ``variable.numpy()`` goes through tape and distribution wrappers (~35 µs a variable); the
    generated op wrapper ~14 µs; TF's eager fast path for ``ReadVariableOp`` on the handle ~7 µs.
    This runs after every step, so it matters. Falls back to the public path if the fast path
    is not there (other TF versions).
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
    except Exception:
        return lambda: [v.numpy() for v in variables]


def pick_loss(output: Any):
    """The loss in a replica function's output: a "loss" entry, else the first floating scalar."""
    import tensorflow as tf

    if isinstance(output, dict):
        for key in output:
            if "loss" in str(key).lower():
                value = output[key]
                if _is_float_scalar(value):
                    return value
    for value in tf.nest.flatten(output):
        if _is_float_scalar(value):
            return value
    return None


def _is_float_scalar(value: Any) -> bool:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return False
    try:
        return shape.rank == 0 and dtype.is_floating
    except AttributeError:
        return False


class ReplicaLossProbe:
    def __init__(self, agent: "Agent", probe: "StepProbe", announce: Callable[[Any], None] | None) -> None:
        self.agent = agent
        self.probe = probe
        self.announce = announce
        self._slots: dict[int, LossSlot] = {}
        self.strategies: weakref.WeakSet = weakref.WeakSet()  # made so far (see prepare)
        self._replica = threading.local()  # per replica thread: did Keras capture this step?
        probe.loss_reader = self.read_for

    # --- reading (training thread, after a step call) ---------------------------------------

    def read_for(self, fn: Any) -> tuple[float, ...] | None:
        slot = self.probe.flags_of(fn).get("loss")
        if slot is None or not self.agent.enabled(PROBE):
            return None
        try:
            return slot.read()
        except Exception as e:
            self.agent.probe_failed(PROBE, e)
            return None

    # --- capturing (replica context) ----------------------------------------------------------

    def slot_for(self, strategy) -> LossSlot:
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

    def capture(self, loss: Any) -> None:
        """Keeps ``loss`` as the current replica's loss (called in replica context)."""
        if loss is None or not self.agent.enabled(PROBE):
            return
        import tensorflow as tf

        try:
            self.agent.inject_fault(PROBE)
            ctx = tf.distribute.get_replica_context()
            if ctx is None:
                return
            if tf.executing_eagerly():
                rid = ctx.replica_id_in_sync_group
                self.probe.eager_losses[int(rid)] = float(tf.reduce_mean(tf.cast(loss, tf.float32)).numpy())
                return
            slot = self._slots.get(id(ctx.strategy))
            if slot is None:  # made in cross-replica context by the strategy.run wrapper
                return
            slot.var.assign(tf.cast(loss, tf.float32))
            self.probe.mark("loss", slot)
        except Exception as e:
            self.agent.probe_failed(PROBE, e)

    def wrap_replica_fn(self, fn: Callable) -> Callable:
        probe = self

        def replica_fn(*args, **kwargs):
            probe._replica.keras_captured = False
            output = fn(*args, **kwargs)
            if not getattr(probe._replica, "keras_captured", False):
                try:
                    probe.capture(pick_loss(output))
                except Exception as e:
                    probe.agent.probe_failed(PROBE, e)
            return output

        return replica_fn

    # --- strategy.run -------------------------------------------------------------------------

    def make_run_wrapper(self, original: Callable) -> Callable:
        import tensorflow as tf

        this = self
        probe = self.probe
        agent = self.agent

        def run(strategy, fn, args=(), kwargs=None, options=None):
            if not agent.enabled("steps"):
                return original(strategy, fn, args, kwargs, options)
            try:
                if this.announce is not None:
                    this.announce(strategy)
                wrapped = this.wrap_replica_fn(fn) if agent.enabled(PROBE) else fn
            except Exception as e:
                agent.probe_failed(PROBE, e)
                wrapped = fn
            if not tf.executing_eagerly():
                try:
                    if agent.enabled(PROBE):
                        this.slot_for(strategy)  # variables can only be made in cross-replica context
                except Exception as e:
                    agent.probe_failed(PROBE, e)
                try:
                    add_in_graph(probe, RUNS, 1.0)
                except Exception as e:
                    agent.probe_failed("steps", e)
                return original(strategy, wrapped, args, kwargs, options)
            if probe.current_top is not None or probe.in_eager_run:
                return original(strategy, wrapped, args, kwargs, options)
            # A top-level eager strategy.run: a step if its replicas compute gradients.
            with probe.eager_run():
                start = probe.perf()
                result = original(strategy, wrapped, args, kwargs, options)
                elapsed = probe.perf() - start
            if probe.eager_run_trained:
                try:
                    losses = tuple(v for _, v in sorted(probe.eager_losses.items())) or None
                    probe.record_eager_run(elapsed, losses)
                except Exception as e:
                    agent.probe_failed("steps", e)
            else:
                probe.eager_wait_s = 0.0
            return result

        return run

    # --- Keras --------------------------------------------------------------------------------

    def make_compute_loss_wrapper(self, original: Callable, unscale: Callable | None) -> Callable:
        this = self

        def _compute_loss(model, *args, **kwargs):
            loss = original(model, *args, **kwargs)
            if kwargs.get("training", True) is False:
                return loss
            try:
                value = unscale(loss) if unscale is not None else loss
                this.capture(value)
                this._replica.keras_captured = True
            except Exception as e:
                this.agent.probe_failed(PROBE, e)
            return loss

        return _compute_loss


def install(agent: "Agent", patches, probe: "StepProbe", announce: Callable[[Any], None] | None = None) -> ReplicaLossProbe:
    from tensorflow.python.distribute import distribute_lib

    rl = ReplicaLossProbe(agent, probe, announce)
    probe.before_first_call.append(rl.prepare)
    patches.wrap(distribute_lib.StrategyBase, "run", rl.make_run_wrapper)

    def make_init(original):
        def __init__(strategy, *args, **kwargs):
            original(strategy, *args, **kwargs)
            try:
                rl.strategies.add(strategy)
            except TypeError:  # not weak-referenceable: its slot is made at its first trace
                pass

        return __init__

    patches.wrap(distribute_lib.StrategyBase, "__init__", make_init)
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
    _install_keras(agent, patches, rl)
    return rl


def _unscale_tf_keras(loss):
    """tf_keras divides each replica's loss by the replicas in sync (losses_utils.
    scale_loss_for_distribution); its loss metric, like ours, is the unscaled value."""
    import tensorflow as tf

    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return loss * replicas if replicas > 1 else loss


def _install_keras(agent: "Agent", patches, rl: ReplicaLossProbe) -> None:
    """Keras 3's per-replica loss (only if Keras 3 is importable; legacy tf_keras below)."""
    import importlib.util

    if importlib.util.find_spec("keras") is not None:
        try:
            from keras.src.losses import loss as keras_loss
            from keras.src.trainers import trainer as keras_trainer

            unscale = getattr(keras_loss, "unscale_loss_for_distribution", None)
            patches.wrap(keras_trainer.Trainer, "_compute_loss", lambda orig: rl.make_compute_loss_wrapper(orig, unscale))
        except Exception as e:
            agent.event("info", f"probe:{PROBE}", f"Keras 3 loss hook not installed ({type(e).__name__}: {e}); using strategy.run outputs")
    # Legacy Keras 2 (tf_keras): patch only when the script selects it, to avoid importing it.
    import os

    if os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true") and importlib.util.find_spec("tf_keras"):
        try:
            from tf_keras.src.engine import training as tfk_training

            patches.wrap(tfk_training.Model, "compute_loss", lambda orig: rl.make_compute_loss_wrapper(orig, _unscale_tf_keras))
        except Exception as e:
            agent.event("info", f"probe:{PROBE}", f"tf_keras loss hook not installed ({type(e).__name__}: {e})")

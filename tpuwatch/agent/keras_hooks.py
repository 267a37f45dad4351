"""Epochs and ``fit`` configuration from Keras, without changing the script.

``model.fit`` drives every callback through one ``CallbackList``; wrapping its
``on_train_begin``/``on_epoch_begin``/``on_epoch_end`` at class level sees every fit, whatever
callbacks the script passes. Keras 3 (``keras.src.callbacks.callback_list.CallbackList``) and
legacy tf_keras (``tf_keras.src.callbacks.CallbackList``, used with ``TF_USE_LEGACY_KERAS=1``)
are both covered.

Choice: the patches go in when the script imports the module (:mod:`tpuwatch.agent.post_import`),
never by importing Keras ourselves; if it is already imported, they go in at once. (In TF 2.21
``import tensorflow`` itself imports Keras 3, so in practice that is at TF import.)

Everything runs on the training thread at epoch boundaries: no per-step cost.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import TYPE_CHECKING, Any, Callable, Mapping

from tpuwatch.agent.patches import PatchError
from tpuwatch.protocol import Config, Epoch

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.patches import Patches

PROBE = "keras"

KERAS3_MODULE = "keras.src.callbacks.callback_list"
LEGACY_MODULE = "tf_keras.src.callbacks"
_MAX_LOGS = 32


def plain_logs(logs: Any) -> dict[str, float]:
    """Keras logs as plain floats; entries that are not scalars are left out."""
    if not isinstance(logs, Mapping):
        return {}
    out: dict[str, float] = {}
    for key, value in list(logs.items())[:_MAX_LOGS]:
        if isinstance(value, bool):
            continue
        if isinstance(value, numbers.Real):
            out[str(key)] = float(value)
            continue
        # numpy scalars and 0-d tensors: only when they hold exactly one number.
        size = getattr(value, "size", None)
        shape = getattr(value, "shape", None)
        if size == 1 or (shape is not None and len(tuple(shape)) == 0):
            try:
                out[str(key)] = float(value)
            except (TypeError, ValueError):
                continue  # a non-numeric entry (a string, a dtype): not a metric
    return out


def _int_or_none(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    if hasattr(value, "numpy"):  # tf_keras keeps steps_per_execution in a tf.Variable
        value = value.numpy()
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if math.isfinite(number) else None


def keras_of(cls: type) -> str | None:
    """The version of the Keras a class belongs to: Keras 3 ("3.15.1") or tf_keras ("tf_keras
    2.21.0"). With TF_USE_LEGACY_KERAS=1 a script may still ``import keras`` and train with
    Keras 3: what runs fit is what counts."""
    import sys

    package = (getattr(cls, "__module__", "") or "").split(".")[0]
    module = sys.modules.get(package)
    version = getattr(module, "__version__", None)
    if not isinstance(version, str):
        return None
    return version if package == "keras" else f"{package} {version}"


def sums_logs_over_replicas(version: str | None) -> bool:
    """Whether this Keras reduces fit's logs by summing the replicas' values: Keras 3.0-3.2 (their
    ``reduce_per_replica`` turns "auto" into "sum", TPUs included). Keras 3.3-3.6 log replica 0's
    loss, 3.7 and later average, and tf_keras' logs are its synchronised metrics."""
    if not version or not version[:1].isdigit():
        return False  # tf_keras ("tf_keras 2.21.0") or unknown
    parts = version.split(".")
    return parts[0] == "3" and len(parts) > 1 and parts[1] in ("0", "1", "2")


class KerasHooks:
    def __init__(self, agent: "Agent") -> None:
        self.agent = agent
        self.epoch: int | None = None  # the epoch running now (0-based), for other probes
        self.logs_checked = False  # Keras' logged loss compared with the agent's (once a run)

    def check_logged_loss(self, logs: Any) -> None:
        """After a batch: is Keras' logged loss the replicas' losses summed, not their mean?

        Keras 3.0-3.2 reduce their logs by summing each replica's values (their "auto" is "sum",
        TPUs included), so the progress bar shows N times the loss the model computes, and every
        metric N times too (seen on Keras 3.0.5 + TF 2.16.2; 3.3-3.6 log replica 0's, 3.7+ average). The agent
        keeps each replica's own mean; this says, once, why the two numbers differ. Done at the
        first batch whose losses were read (a run's first records always are), and only for the
        Keras versions that sum (``sums_logs_over_replicas``)."""
        last = self.agent.step_probe.last_loss if self.agent.step_probe is not None else None
        if self.logs_checked or last is None or not isinstance(logs, dict) or "loss" not in logs:
            return
        step, mean, replicas = last
        self.logs_checked = True
        if step != self.agent.global_step or replicas < 2:
            return
        logged = float(logs["loss"])
        summed = replicas * mean
        if abs(logged - summed) <= 1e-4 * abs(summed) and abs(logged - mean) > 1e-3 * abs(mean):
            self.agent.event("warning", "keras", (
                f"Keras logs the loss summed over the {replicas} replicas, not their mean: its progress "
                f"bar shows {logged:.6g} at step {step}, {replicas}x the {mean:.6g} the model computes (and "
                f"its metrics {replicas}x too). tpuwatch shows each replica's own mean. Keras 3.0-3.2 sum "
                f"their logs over replicas; Keras 3.3-3.6 log replica 0's loss, 3.7 and later the mean."))

    def train_begin(self, callbacks: Any) -> None:
        params = getattr(callbacks, "params", None) or {}
        epochs = _int_or_none(params.get("epochs"))
        steps = _int_or_none(params.get("steps"))
        model = getattr(callbacks, "model", None)
        spe = getattr(model, "steps_per_execution", None) if model is not None else None
        if spe is None and model is not None:
            spe = getattr(model, "_steps_per_execution", None)
        # A script may fit several times (and train in other ways between): the total is where
        # this fit ends on the run's global step count, so it means nothing once that is passed.
        self.agent.emit(Config(
            t=self.agent.clock(),
            epochs=epochs,
            total_steps=self.agent.global_step + epochs * steps if epochs and steps else None,
            steps_per_execution=_int_or_none(spe),
            keras_version=keras_of(type(callbacks)),
        ))
        # Keras 3's dtype policy is thread-local: this is the training thread, read it here.
        from tpuwatch.agent import environment

        environment.policy_watcher(self.agent).check()

    def epoch_event(self, phase: str, epoch: Any, logs: Any, model: Any = None) -> None:
        number = _int_or_none(epoch)
        if number is None:
            return
        self.epoch = number
        values = plain_logs(logs) if phase == "end" else {}
        if phase == "end" and "learning_rate" not in values and "lr" not in values:
            lr = learning_rate(model)
            if lr is not None:
                values["learning_rate"] = lr
        self.agent.emit(Epoch(
            t=self.agent.clock(), epoch=number, phase=phase,  # type: ignore[arg-type]
            step=self.agent.global_step, logs=values,
        ))


def learning_rate(model: Any) -> float | None:
    """The optimizer's current learning rate (Keras 3 does not log it; tf_keras' callbacks may)."""
    optimizer = getattr(model, "optimizer", None)
    try:
        value = getattr(optimizer, "learning_rate", None)
        if value is None or callable(value) and not hasattr(value, "numpy"):
            return None  # a schedule object: its value depends on the step
        number = float(value.numpy() if hasattr(value, "numpy") else value)
    except (TypeError, ValueError, AttributeError, RuntimeError):
        return None
    return number if math.isfinite(number) else None


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


def patch_callback_list(agent: "Agent", patches: "Patches", hooks: KerasHooks, cls: type) -> None:
    def make_train_begin(original: Callable[..., Any]) -> Callable[..., Any]:
        def on_train_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
            if agent.enabled(PROBE):
                try:
                    hooks.train_begin(self)
                except Exception as e:  # a hook's bug never fails the script's fit: only the probe stops
                    agent.probe_failed(PROBE, e)
            return original(self, *args, **kwargs)

        return on_train_begin

    def make_epoch(original: Callable[..., Any], phase: str) -> Callable[..., Any]:
        def on_epoch(self: Any, *args: Any, **kwargs: Any) -> Any:
            if agent.enabled(PROBE):
                try:
                    if phase == "end" and agent.step_probe is not None:
                        agent.step_probe.read_unread_losses()  # the epoch's last step's losses
                    hooks.epoch_event(phase, _arg(args, kwargs, 0, "epoch"), _arg(args, kwargs, 1, "logs"),
                                      getattr(self, "model", None))
                except Exception as e:  # a hook's bug never fails the script's fit: only the probe stops
                    agent.probe_failed(PROBE, e)
            return original(self, *args, **kwargs)

        return on_epoch

    summing = sums_logs_over_replicas(keras_of(cls))

    def make_batch_end(original: Callable[..., Any]) -> Callable[..., Any]:
        def on_train_batch_end(self: Any, *args: Any, **kwargs: Any) -> Any:
            if summing and not hooks.logs_checked and agent.enabled(PROBE):
                try:
                    hooks.check_logged_loss(_arg(args, kwargs, 1, "logs"))
                except Exception as e:  # a hook's bug never fails the script's fit: only the probe stops
                    agent.probe_failed(PROBE, e)
            return original(self, *args, **kwargs)

        return on_train_batch_end

    def make_phase(original: Callable[..., Any], begin: str | None) -> Callable[..., Any]:
        """``begin``: the phase an ``on_*_begin`` starts; None: an ``on_*_end`` (back to host)."""

        def on_phase(self: Any, *args: Any, **kwargs: Any) -> Any:
            if agent.enabled("phases"):
                try:
                    if begin is None:
                        agent.phases.end()
                    else:
                        agent.phases.begin("evaluating", begin)
                except Exception as e:  # a hook's bug never fails the script's fit: only the probe stops
                    agent.probe_failed("phases", e)
            return original(self, *args, **kwargs)

        return on_phase

    def make_train_end(original: Callable[..., Any]) -> Callable[..., Any]:
        def on_train_end(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, *args, **kwargs)
            if agent.enabled("phases"):
                try:
                    agent.phases.enter("host")
                except Exception as e:  # a hook's bug never fails the script's fit: only the probe stops
                    agent.probe_failed("phases", e)
            return result

        return on_train_end

    try:  # phases are their own probe: a Keras without these hooks keeps the epoch probe
        for method, begin in (("on_test_begin", "evaluate"), ("on_test_end", None),
                              ("on_predict_begin", "predict"), ("on_predict_end", None)):
            patches.wrap(cls, method, functools.partial(make_phase, begin=begin))
        patches.wrap(cls, "on_train_end", make_train_end)
    except PatchError as e:
        agent.probe_failed("phases", e)
    patches.wrap(cls, "on_train_begin", make_train_begin)
    patches.wrap(cls, "on_train_batch_end", make_batch_end)
    patches.wrap(cls, "on_epoch_begin", lambda original: make_epoch(original, "begin"))
    patches.wrap(cls, "on_epoch_end", lambda original: make_epoch(original, "end"))


def install(agent: "Agent", patches: "Patches") -> KerasHooks:
    """Patches Keras 3's and tf_keras's CallbackList when (or as soon as) they are imported."""
    from tpuwatch.agent import post_import

    hooks = KerasHooks(agent)

    def on_error(e: BaseException) -> None:
        agent.probe_failed(PROBE, e)

    post_import.when_imported(
        KERAS3_MODULE, lambda m: patch_callback_list(agent, patches, hooks, m.CallbackList), on_error)
    post_import.when_imported(
        LEGACY_MODULE, lambda m: patch_callback_list(agent, patches, hooks, m.CallbackList), on_error)
    return hooks

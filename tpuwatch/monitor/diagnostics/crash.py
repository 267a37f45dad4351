"""``script-crash``: the script died with an exception; say what it means and what to change.

The agent records the exception (``ExceptionRaised``: type, message, traceback). The rule
matches it against known failure signatures of TensorFlow/Keras training scripts, each proved by
a real script in ``sample_runs/crashes/``, and names the script's own line. An exception that
matches no signature still gets a finding with the line and the error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tpuwatch.monitor.tracebacks import script_frame, strip_own_frames
from tpuwatch.protocol import ExceptionRaised, Finding, Message

from .robust_stats import sig
from .rule import Rule
from .telemetry import Telemetry, Worker
from .thresholds import Thresholds

MB = 1 << 20


@dataclass(frozen=True)
class Crash:
    type: str
    message: str
    traceback: str  # tpuwatch's own frames left out

    @property
    def text(self) -> str:
        return f"{self.type}: {self.message}\n{self.traceback}"


@dataclass(frozen=True)
class Signature:
    id: str
    matches: Callable[[Crash, Telemetry], bool]
    meaning: str
    advice: str


def _has(*needles: str) -> Callable[[Crash, Telemetry], bool]:
    return lambda c, tel: all(n in c.text for n in needles)


def _attr(name: str) -> Callable[[Crash, Telemetry], bool]:
    return lambda c, tel: c.type == "AttributeError" and f"no attribute '{name}'" in c.message


def _spe_crash(c: Crash, tel: Telemetry) -> bool:
    spe = tel.config.get("steps_per_execution")
    return ("You must feed a value for placeholder tensor" in c.text
            and ("multi_step_on_iterator" in c.text or (isinstance(spe, int) and spe > 1)))


_KERAS3 = "Keras 2 code on Keras 3: "

#: Most specific first: the first match wins.
SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "steps-per-execution-mirrored", _spe_crash,
        "Keras 3 model.fit with steps_per_execution > 1 under MirroredStrategy fails in the "
        "compiled multi-step loop (keras-team/keras#19246); the same fit works with 1",
        "compile(..., steps_per_execution=1) under MirroredStrategy (keep > 1 on TPUStrategy, "
        "where it works), or write a custom loop that runs several steps in a tf.range inside "
        "one tf.function"),
    Signature(
        "optimizer-built-lazily", _has("You must feed a value for placeholder tensor"),
        "the optimizer's variables (Adam's momentum and velocity slots) were created lazily "
        "by the first apply_gradients inside the distributed tf.function step; Keras 3 cannot "
        "create them there (this crashes TF's own custom-training tutorial on TF 2.21)",
        "build the optimizer inside strategy.scope() right after the model: "
        "optimizer.build(model.trainable_variables)"),
    Signature(
        "tensorboard-not-installed", lambda c, tel: c.type == "TBNotInstalledError",
        "the TensorBoard callback (or tf.summary) needs the tensorboard package, which is not "
        "installed in this environment",
        "pip install tensorboard (the same version line as TensorFlow), or drop the "
        "keras.callbacks.TensorBoard callback"),
    Signature(
        "keras3-reset-states", _attr("reset_states"),
        _KERAS3 + "Metric.reset_states() and RNN layer reset_states() were renamed",
        "call reset_state() (singular)"),
    Signature(
        "keras3-loss-reduction", _has("has no attribute 'Reduction'"),
        _KERAS3 + "keras.losses.Reduction (tf.keras.losses.Reduction.NONE, .SUM, ...) is gone",
        "pass a string or None: reduction=None (was NONE), 'sum', 'sum_over_batch_size' "
        "(was SUM_OVER_BATCH_SIZE)"),
    Signature(
        "keras3-optimizer-lr", _attr("lr"),
        _KERAS3 + "optimizer.lr was removed",
        "use optimizer.learning_rate (a variable: optimizer.learning_rate.assign(x) to change it)"),
    Signature(
        "keras3-optimizer-legacy", _has("has no attribute 'legacy'"),
        _KERAS3 + "keras.optimizers.legacy is gone",
        "use keras.optimizers.Adam/SGD/... (or tf_keras with TF_USE_LEGACY_KERAS=1 for Keras 2)"),
    Signature(
        "keras3-get-updates", _attr("get_updates"),
        _KERAS3 + "optimizer.get_updates() was removed",
        "apply gradients with optimizer.apply_gradients(zip(grads, model.trainable_variables))"),
    Signature(
        "keras3-bare-metric", _has("Expected `metrics` argument to be a list, tuple, or dict"),
        _KERAS3 + "compile(metrics=...) takes a list (or a dict per output), not one metric",
        "wrap it in a list: metrics=[keras.metrics.AUC()] (likewise metrics=['accuracy'])"),
    Signature(
        "keras3-save-savedmodel",
        lambda c, tel: ("Invalid filepath extension for saving" in c.message
                        or "The `save_format` argument is deprecated in Keras 3" in c.message),
        _KERAS3 + "model.save() writes only a .keras (or .h5) file; a directory path or "
        "save_format='tf' made a SavedModel in Keras 2",
        "give the file a .keras extension: model.save('model.keras'); for a SavedModel to serve, "
        "model.export('saved_model_dir')"),
    Signature(
        "keras3-load-savedmodel",
        _has("File format not supported", "legacy SavedModel format is not supported"),
        _KERAS3 + "keras.models.load_model() reads only .keras and .h5 files, not a SavedModel "
        "directory",
        "load a SavedModel for inference with keras.layers.TFSMLayer(path, "
        "call_endpoint='serving_default'); to train it again, save it from the training script "
        "as model.save('model.keras') and load that"),
    Signature(
        "keras3-weights-filename",
        lambda c, tel: ("The filename must end in `.weights.h5`" in c.message
                        or ("save_weights_only=True" in c.message and "`.weights.h5`" in c.message)),
        _KERAS3 + "weights are saved only to a file whose name ends in .weights.h5 (save_weights, "
        "ModelCheckpoint(save_weights_only=True)); Keras 2 wrote a TF checkpoint",
        "end the path in .weights.h5: model.save_weights('model.weights.h5'), "
        "ModelCheckpoint('ckpt-{epoch:02d}.weights.h5', save_weights_only=True)"),
    Signature(
        "keras3-checkpoint-filepath", _has("The filepath provided must end in `.keras`"),
        _KERAS3 + "ModelCheckpoint saves a whole model only to a path ending in .keras",
        "end the path in .keras: ModelCheckpoint('model-{epoch:02d}.keras') (or "
        "'....weights.h5' with save_weights_only=True)"),
    Signature(
        "keras3-generator-methods",
        lambda c, tel: c.type == "AttributeError" and any(
            f"no attribute '{m}'" in c.message
            for m in ("fit_generator", "evaluate_generator", "predict_generator")),
        _KERAS3 + "fit_generator, evaluate_generator and predict_generator were removed",
        "pass the generator to fit, evaluate or predict themselves, with the same arguments: "
        "model.fit(generator, steps_per_epoch=..., epochs=...)"),
    Signature(
        "keras3-fit-workers",
        lambda c, tel: c.type == "TypeError" and "unexpected keyword argument" in c.message and any(
            f"'{a}'" in c.message for a in ("workers", "use_multiprocessing", "max_queue_size")),
        _KERAS3 + "fit, evaluate and predict no longer take workers, use_multiprocessing or "
        "max_queue_size",
        "remove them from the call; a keras.utils.PyDataset takes them instead "
        "(super().__init__(workers=4, use_multiprocessing=True) in its __init__), and a "
        "tf.data pipeline needs none"),
    Signature(
        "keras3-optimizer-lr-argument", _has("Argument(s) not recognized: {'lr'"),
        _KERAS3 + "optimizers take learning_rate=, not lr=",
        "rename the argument: keras.optimizers.Adam(learning_rate=1e-3)"),
    Signature(
        "keras3-tf-op-on-keras-input", _has("A KerasTensor cannot be used as input to a TensorFlow function"),
        _KERAS3 + "a TensorFlow op (tf.expand_dims, tf.cast, tf.nn.*) was applied to a keras.Input "
        "while building a functional model; Keras 3's symbolic tensors are not TensorFlow tensors",
        "use the keras.ops function of the same name (keras.ops.expand_dims(x, -1), "
        "keras.ops.cast(x, 'float32')), or wrap the TensorFlow call in a layer's call()"),
    Signature(
        "keras3-experimental-namespace", _has("has no attribute 'experimental'"),
        _KERAS3 + "the .experimental namespaces (keras.layers.experimental.preprocessing, "
        "keras.mixed_precision.experimental) are gone",
        "drop .experimental (and .preprocessing): keras.layers.Rescaling, keras.layers.RandomFlip, "
        "keras.layers.TextVectorization; keras.mixed_precision.set_global_policy('mixed_bfloat16')"),
    Signature(
        "keras3-backend-value",
        lambda c, tel: c.type == "AttributeError" and "module 'keras.backend' has no attribute" in c.message,
        _KERAS3 + "keras.backend lost its TensorFlow-1 helpers (set_value, get_value, get_session, "
        "eval, ...)",
        "set a variable with its assign method: model.optimizer.learning_rate.assign(1e-4) (was "
        "keras.backend.set_value); read one with keras.ops.convert_to_numpy(v) (was get_value); "
        "session code has no counterpart: drop it"),
    Signature(
        "keras3-module-path",
        lambda c, tel: c.type in ("ModuleNotFoundError", "ImportError")
        and ("No module named 'keras." in c.message or "from 'keras." in c.message),
        _KERAS3 + "Keras 2's internal module paths (keras.engine, keras.utils.np_utils, "
        "keras.layers.advanced_activations, ...) do not exist in Keras 3",
        "import the name from Keras 3's public API: from keras.utils import to_categorical, "
        "from keras.layers import LeakyReLU, keras.Layer, keras.Model"),
    Signature(
        "keras3-layer-argument", _has("Unrecognized keyword arguments passed to"),
        "a layer was given an argument it does not take: one Keras 3 dropped (Keras 2's "
        "BatchNormalization(fused=...)) or a misspelt name",
        "remove (or correct) the argument the error names: BatchNormalization(fused=True) becomes "
        "keras.layers.BatchNormalization()"),
    Signature(
        "out-of-memory",
        lambda c, tel: c.type == "ResourceExhaustedError" or "OOM when allocating" in c.message,
        "a tensor did not fit in the device's memory (out of memory)",
        "lower the per-replica batch size; keras.mixed_precision.set_global_policy("
        "'mixed_bfloat16') halves activations; rematerialise activations (tf.recompute_grad, "
        "gradient checkpointing); shard the model over more devices"),
    Signature(
        "merge-call-in-nested-function", _has("merge_call", "called while defining a new graph"),
        "a cross-replica synchronisation (optimizer.apply_gradients' all-reduce) ran inside a "
        "tf.function nested in strategy.run, or inside control flow in the replica function",
        "decorate the function that calls strategy.run with @tf.function and leave the replica "
        "function passed to strategy.run undecorated; do not decorate train_step/test_step "
        "overrides with tf.function"),
    Signature(
        "dataset-not-batched",
        lambda c, tel: c.type == "IndexError" and ("compute_batch_size" in c.text
                                                   or "_make_rebatch_fn" in c.text),
        "the dataset given to strategy.experimental_distribute_dataset is not batched: the "
        "strategy splits the batch dimension across replicas and found none",
        "batch with the global batch size before distributing: "
        "dataset.batch(per_replica_batch * strategy.num_replicas_in_sync, drop_remainder=True), "
        "or use strategy.distribute_datasets_from_function with per-replica batches"),
    Signature(
        "no-tpu-found",
        lambda c, tel: ("Please provide a TPU Name" in c.message
                        or ("TPU" in c.text and c.type in ("NotFoundError", "ValueError")
                            and ("TPUClusterResolver" in c.text or "initialize_tpu_system" in c.text))),
        "TPUClusterResolver found no TPU: without tpu= it only finds one on a TPU VM (or with "
        "the TPU_NAME environment variable); this machine has none",
        "pass tpu='local' on a TPU VM, or tpu='<name>' for a TPU node; to run the same script "
        "elsewhere, fall back when the resolver raises ValueError: "
        "strategy = tf.distribute.MirroredStrategy() (or the default strategy)"),
)


class ScriptCrash(Rule):
    """The script raised out of ``__main__``: the known signature it matches, and its line."""

    id = "script-crash"
    observes = (ExceptionRaised,)

    def __init__(self, th: Thresholds) -> None:
        super().__init__(th)
        self.crashes: dict[str, tuple[ExceptionRaised, Crash]] = {}

    def observe(self, msg: Message, w: Worker, tel: Telemetry) -> None:
        assert isinstance(msg, ExceptionRaised)
        tb, _ = strip_own_frames(msg.traceback)
        message, _ = strip_own_frames(msg.message)
        self.crashes[w.name] = (msg, Crash(msg.type, message, tb))

    def check(self, tel: Telemetry) -> None:
        for name, (msg, crash) in self.crashes.items():
            if name in self._found:
                continue
            self._keep(name, self._finding(name, msg, crash, tel))

    def _finding(self, name: str, msg: ExceptionRaised, crash: Crash, tel: Telemetry) -> Finding:
        frame = script_frame(msg.traceback + "\n" + msg.message)
        sig_ = next((s for s in SIGNATURES if s.matches(crash, tel)), None)
        first_line = next((ln.strip() for ln in crash.message.splitlines() if ln.strip()), "")
        w = tel.workers.get(name)
        where = f" at {frame.path}:{frame.line}" if frame else ""
        evidence: dict[str, float | int | str] = {
            "exception": crash.type,
            "error": first_line[:300],
            "signature": sig_.id if sig_ else "unknown",
        }
        if frame:
            evidence["script_line"] = str(frame)
        if w is not None and w.step:
            evidence["last_step"] = w.step
        if sig_ is None:
            meaning = f"{crash.type}{where}: {first_line[:200]} (no known failure signature)"
            advice = ("Read the error at the script's line; `tpuwatch report` shows the traceback "
                      "without tpuwatch's own frames")
        else:
            meaning = f"{crash.type}{where}: {sig_.meaning}"
            advice = sig_.advice
            if sig_.id == "out-of-memory":
                meaning += _memory_context(tel, w, evidence)
        return Finding(
            t=msg.t, rule=self.id, severity="critical",
            message=f"script crashed: {meaning}",
            advice=advice + (f" (the script's line: {frame})" if frame else ""),
            evidence=evidence,
            first_step=w.step if w is not None and w.step else None,
            last_step=w.step if w is not None and w.step else None,
            worker=name,
        )


def _memory_context(tel: Telemetry, w: Worker | None, evidence: dict[str, Any]) -> str:
    """Headroom history and per-replica batch for an out-of-memory crash."""
    parts: list[str] = []
    per_replica = tel.config.get("per_replica_batch_size")
    if not isinstance(per_replica, int):
        gb, reps = tel.config.get("global_batch_size"), (tel.topology.replicas if tel.topology else None)
        if isinstance(gb, int) and reps:
            per_replica = gb // reps
        elif w is not None and w.examples and reps:
            per_replica = w.examples.most_common(1)[0][0] // max(1, w.latest_topology.local_replicas
                                                                  if w.latest_topology else reps)
    if isinstance(per_replica, int):
        evidence["per_replica_batch"] = per_replica
        parts.append(f"per-replica batch {per_replica}")
    if w is not None:
        with_limit = [(d, d.limit_bytes) for d in w.devices.values() if d.limit_bytes]
        if with_limit:
            d, limit = max(with_limit, key=lambda x: x[0].peak_bytes / x[1])
            pct = round(100 * d.peak_bytes / limit)
            evidence["device_peak_pct"] = pct
            evidence["device"] = d.device
            parts.append(f"device memory peaked at {pct}% of {limit / MB:.0f} MiB on {d.device}")
        elif w.devices:
            d = max(w.devices.values(), key=lambda d: d.peak_bytes)
            evidence["device_peak_mib"] = round(d.peak_bytes / MB)
            parts.append(f"device memory peaked at {d.peak_bytes / MB:.0f} MiB on {d.device} (limit unknown)")
        if w.rss_points:
            evidence["host_rss_mb"] = sig(w.rss_points[-1][1] / MB, 3)
            if w.available_bytes is not None:
                evidence["host_available_mb"] = sig(w.available_bytes / MB, 3)
                parts.append(f"host RSS {w.rss_points[-1][1] / MB:.0f} MB with "
                             f"{w.available_bytes / MB:.0f} MB available")
    return f" ({'; '.join(parts)})" if parts else ""

"""script-crash on recorded exception messages, and tracebacks without tpuwatch's own frames.
(Every signature is also triggered by a real script: test_crash_scripts.py.)"""

from __future__ import annotations

from diag_synthetic import SyntheticRun, findings

from tpuwatch.monitor.tracebacks import (
    script_frame,
    strip_own_frames,
    without_own_frames,
)
from tpuwatch.protocol import ExceptionRaised

TB = '''Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "<frozen runpy>", line 88, in _run_code
  File "/site/tpuwatch/agent/__main__.py", line 170, in <module>
    sys.exit(main())
             ^^^^^^
  File "/home/me/train.py", line 42, in <module>
    train_step(batch)
  File "/site/tpuwatch/agent/steps.py", line 141, in __call__
    return self._call(*args)
  File "/venv/lib/python3.11/site-packages/tensorflow/python/eager/execute.py", line 59, in quick_execute
    except TypeError as e:
tensorflow.python.framework.errors_impl.InvalidArgumentError: Graph execution error:

Detected at node cond/Placeholder_2 defined at (most recent call last):
  File "<frozen runpy>", line 88, in _run_code

  File "/site/tpuwatch/agent/__main__.py", line 142, in _run_script

  File "/home/me/train.py", line 42, in <module>

You must feed a value for placeholder tensor 'cond/else/_1/cond/Placeholder_2' with dtype int32
'''


def test_own_frames_are_left_out_and_counted():
    text, n = strip_own_frames(TB)
    assert n == 6
    assert "<frozen runpy>" not in text and "tpuwatch/agent" not in text
    assert "sys.exit(main())" not in text and "return self._call" not in text and "^^^^^^" not in text
    assert 'File "/home/me/train.py", line 42, in <module>\n    train_step(batch)' in text
    assert "quick_execute" in text and "You must feed a value" in text
    assert without_own_frames(TB).endswith(
        "(tpuwatch left out 6 frames of its own: <frozen runpy> and tpuwatch/agent)")
    assert without_own_frames("ValueError: x") == "ValueError: x"


def test_script_frame_is_the_deepest_frame_of_user_code_with_its_source():
    f = script_frame(TB)
    assert (f.path, f.line, f.function, f.code) == ("/home/me/train.py", 42, "<module>", "train_step(batch)")
    assert str(f) == "/home/me/train.py:42 in <module>: train_step(batch)"
    assert script_frame("no frames here") is None


PLAIN_TB = TB.split("tensorflow.python.framework")[0]  # the frames, without TF's message


def crash(type_: str, message: str, traceback: str = PLAIN_TB, steps: int = 10) -> list:
    run = SyntheticRun()
    run.steps(steps)
    run.emit(ExceptionRaised(t=run.t, type=type_, message=message, traceback=traceback))
    run.exit(1)
    return findings(run.engine(), "script-crash")


def test_unknown_exception_still_names_the_line():
    (f,) = crash("KeyError", "'labels'")
    assert f.severity == "critical" and f.evidence["signature"] == "unknown"
    assert f.evidence["script_line"] == "/home/me/train.py:42 in <module>: train_step(batch)"
    assert f.evidence["last_step"] == 10 and "KeyError" in f.message


def test_keras2_apis_without_a_real_script_here():
    (f,) = crash("AttributeError", "module 'keras.optimizers' has no attribute 'legacy'")
    assert f.evidence["signature"] == "keras3-optimizer-legacy" and "keras.optimizers.Adam" in f.advice
    (f,) = crash("AttributeError", "'SGD' object has no attribute 'get_updates'")
    assert f.evidence["signature"] == "keras3-get-updates" and "apply_gradients" in f.advice


def test_placeholder_error_in_fit_multi_step_is_steps_per_execution_not_the_optimizer():
    (f,) = crash("InvalidArgumentError", "You must feed a value for placeholder tensor 'while/cond/Placeholder_3'",
                 PLAIN_TB.replace("quick_execute", "multi_step_on_iterator"))
    assert f.evidence["signature"] == "steps-per-execution-mirrored"
    (f,) = crash("InvalidArgumentError", "You must feed a value for placeholder tensor 'cond/Placeholder_2'")
    assert f.evidence["signature"] == "optimizer-built-lazily"


def test_out_of_memory_quotes_batch_and_memory():
    run = SyntheticRun(device_limit_bytes=1 << 30, device_peak_bytes=(1 << 30) * 95 // 100)
    run.steps(10, examples=512)
    run.emit(ExceptionRaised(t=run.t, type="ResourceExhaustedError",
                             message="OOM when allocating tensor with shape[512,4096,4096]", traceback=PLAIN_TB))
    (f,) = findings(run.engine(), "script-crash")
    assert f.evidence["signature"] == "out-of-memory"
    assert f.evidence["per_replica_batch"] == 128 and f.evidence["device_peak_pct"] == 95
    assert "per-replica batch 128" in f.message and "95% of 1024 MiB" in f.message
    assert "mixed_bfloat16" in f.advice and "recompute_grad" in f.advice


#: Keras 3.15's own words for Keras 2 code, as the scripts in sample_runs/crashes/keras2_*.py and
#: the variants beside them raised them (test_crash_scripts.py runs those scripts).
KERAS2_ON_KERAS3 = [
    ("ValueError", "Expected `metrics` argument to be a list, tuple, or dict. Received instead: metrics=<AUC "
     "name=auc> of type <class 'keras.src.metrics.confusion_metrics.AUC'>", "keras3-bare-metric",
     "metrics=[keras.metrics.AUC()]"),
    ("ValueError", "Expected `metrics` argument to be a list, tuple, or dict. Received instead: "
     "metrics=accuracy of type <class 'str'>", "keras3-bare-metric", "metrics=['accuracy']"),
    ("ValueError", "Invalid filepath extension for saving. Please add either a `.keras` extension for the "
     "native Keras format (recommended) or a `.h5` extension. Use `model.export(filepath)` if you want to "
     "export a SavedModel for use with TFLite/TFServing/etc. Received: filepath=/tmp/x/saved_model.",
     "keras3-save-savedmodel", "model.save('model.keras')"),
    ("ValueError", "The `save_format` argument is deprecated in Keras 3. Please remove this argument and pass "
     "a file path with either `.keras` or `.h5` extension.Received: save_format=tf",
     "keras3-save-savedmodel", "model.export("),
    ("ValueError", "File format not supported: filepath=/tmp/x/serving. Keras 3 only supports V3 `.keras` "
     "files, legacy H5 format files (`.h5` extension). Note that the legacy SavedModel format is not "
     "supported by `load_model()` in Keras 3. In order to reload a TensorFlow SavedModel as an "
     "inference-only layer in Keras 3, use `keras.layers.TFSMLayer(/tmp/x/serving, "
     "call_endpoint='serving_default')` (note that your `call_endpoint` might have a different name).",
     "keras3-load-savedmodel", "keras.layers.TFSMLayer(path, call_endpoint='serving_default')"),
    ("ValueError", "The filename must end in `.weights.h5`. Received: filepath=/tmp/x/weights",
     "keras3-weights-filename", "model.save_weights('model.weights.h5')"),
    ("ValueError", "When using `save_weights_only=True` in `ModelCheckpoint`, the filepath provided must end "
     "in `.weights.h5` (Keras weights format). Received: filepath=/tmp/x/w-{epoch}",
     "keras3-weights-filename", "save_weights_only=True)"),
    ("ValueError", "The filepath provided must end in `.keras` (Keras model format). Received: "
     "filepath=/tmp/x/model-{epoch:02d}", "keras3-checkpoint-filepath", "ModelCheckpoint('model-{epoch:02d}.keras')"),
    ("AttributeError", "'Sequential' object has no attribute 'fit_generator'", "keras3-generator-methods",
     "model.fit(generator"),
    ("AttributeError", "'Functional' object has no attribute 'predict_generator'", "keras3-generator-methods",
     "predict"),
    ("TypeError", "TensorFlowTrainer.fit() got an unexpected keyword argument 'workers'", "keras3-fit-workers",
     "keras.utils.PyDataset"),
    ("TypeError", "TensorFlowTrainer.fit() got an unexpected keyword argument 'use_multiprocessing'",
     "keras3-fit-workers", "remove them"),
    ("ValueError", "Argument(s) not recognized: {'lr': 0.001}", "keras3-optimizer-lr-argument",
     "Adam(learning_rate=1e-3)"),
    ("ValueError", "A KerasTensor cannot be used as input to a TensorFlow function. A KerasTensor is a "
     "symbolic placeholder for a shape and dtype, used when constructing Keras Functional models or Keras "
     "Functions.", "keras3-tf-op-on-keras-input", "keras.ops.expand_dims(x, -1)"),
    ("AttributeError", "module 'keras.layers' has no attribute 'experimental'", "keras3-experimental-namespace",
     "keras.layers.Rescaling"),
    ("AttributeError", "module 'keras.mixed_precision' has no attribute 'experimental'",
     "keras3-experimental-namespace", "set_global_policy"),
    ("AttributeError", "module 'keras.backend' has no attribute 'set_value'", "keras3-backend-value",
     "learning_rate.assign(1e-4)"),
    ("AttributeError", "module 'keras.backend' has no attribute 'get_session'", "keras3-backend-value",
     "drop it"),
    ("ModuleNotFoundError", "No module named 'keras.utils.np_utils'", "keras3-module-path",
     "from keras.utils import to_categorical"),
    ("ModuleNotFoundError", "No module named 'keras.engine'", "keras3-module-path", "keras.Layer"),
    ("ValueError", "Unrecognized keyword arguments passed to BatchNormalization: {'fused': True}",
     "keras3-layer-argument", "keras.layers.BatchNormalization()"),
]


def test_keras2_code_on_keras3_is_a_known_crash_with_its_fix_and_line():
    """Moving a Keras 2 script to Keras 3: each refusal Keras 3 words is named, with its one change and
    the script's line (a bare metric in compile got "no known failure signature")."""
    for type_, message, signature, advice in KERAS2_ON_KERAS3:
        (f,) = crash(type_, message)
        assert f.evidence["signature"] == signature, (message, f.evidence["signature"])
        assert advice in f.advice, (signature, f.advice)
        assert f.advice.endswith("(the script's line: /home/me/train.py:42 in <module>: train_step(batch))")
        assert "Keras 2 code on Keras 3" in f.message or signature == "keras3-layer-argument"

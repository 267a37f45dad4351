"""script-crash, end to end: each known failure signature is triggered by a real script in
sample_runs/crashes/ under the real agent (`tpuwatch run --headless`), and `tpuwatch report`
names it, with the script's own line and a traceback without tpuwatch's frames."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tpuwatch_testing import SAMPLES, child_env

pytestmark = [pytest.mark.tf, pytest.mark.slow]
CRASHES = SAMPLES / "crashes"


#: Keras 2 code on Keras 3: script -> (signature, the script's line, that line's Keras 2 text, its Keras 3
#: text, what the advice says). The change applied to a copy makes the script run to its end.
KERAS2 = {
    "keras2_bare_metric.py": (
        "keras3-bare-metric", "model.compile(", "metrics=keras.metrics.AUC())",
        "metrics=[keras.metrics.AUC()])", "metrics=[keras.metrics.AUC()]"),
    "keras2_save_savedmodel.py": (
        "keras3-save-savedmodel", "model.save(", '"saved_model"))',
        '"model.keras"))', "model.save('model.keras')"),
    "keras2_load_savedmodel.py": (
        "keras3-load-savedmodel", "keras.models.load_model(exported)", "keras.models.load_model(exported)",
        'keras.layers.TFSMLayer(exported, call_endpoint="serving_default")', "keras.layers.TFSMLayer(path"),
    "keras2_save_weights.py": (
        "keras3-weights-filename", "model.save_weights(", '"weights"))',
        '"model.weights.h5"))', "model.save_weights('model.weights.h5')"),
    "keras2_checkpoint_filepath.py": (
        "keras3-checkpoint-filepath", "ModelCheckpoint(", '"model-{epoch:02d}"))',
        '"model-{epoch:02d}.keras"))', "ModelCheckpoint('model-{epoch:02d}.keras')"),
    "keras2_fit_generator.py": (
        "keras3-generator-methods", "model.fit_generator(", "model.fit_generator(",
        "model.fit(", "model.fit(generator"),
    "keras2_fit_workers.py": (
        "keras3-fit-workers", "workers=4", ", workers=4, use_multiprocessing=True",
        "", "remove them"),
    "keras2_optimizer_lr_argument.py": (
        "keras3-optimizer-lr-argument", "Adam(lr=1e-3)", "Adam(lr=1e-3)",
        "Adam(learning_rate=1e-3)", "Adam(learning_rate=1e-3)"),
    "keras2_tf_op_on_input.py": (
        "keras3-tf-op-on-keras-input", "tf.expand_dims(inputs, -1)", "tf.expand_dims(inputs, -1)",
        "keras.ops.expand_dims(inputs, -1)", "keras.ops.expand_dims(x, -1)"),
    "keras2_experimental_preprocessing.py": (
        "keras3-experimental-namespace", "experimental.preprocessing", "keras.layers.experimental.preprocessing.Rescaling",
        "keras.layers.Rescaling", "keras.layers.Rescaling"),
    "keras2_backend_set_value.py": (
        "keras3-backend-value", "keras.backend.set_value(", "keras.backend.set_value(model.optimizer.learning_rate, 1e-4)",
        "model.optimizer.learning_rate.assign(1e-4)", "learning_rate.assign(1e-4)"),
    "keras2_module_path.py": (
        "keras3-module-path", "keras.utils.np_utils", "from keras.utils.np_utils import to_categorical",
        "from keras.utils import to_categorical", "from keras.utils import to_categorical"),
    "keras2_layer_argument.py": (
        "keras3-layer-argument", "BatchNormalization(fused=True)", "keras.layers.BatchNormalization(fused=True)",
        "keras.layers.BatchNormalization()", "keras.layers.BatchNormalization()"),
}


@pytest.mark.parametrize("script, signature, line, advice", [
    ("optimizer_lazy_build.py", "optimizer-built-lazily", "train_step(batch)", "optimizer.build(model.trainable_variables)"),
    ("steps_per_execution.py", "steps-per-execution-mirrored", "model.fit(", "steps_per_execution=1"),
    ("tensorboard_missing.py", "tensorboard-not-installed", "model.fit(", "pip install tensorboard"),
    ("keras2_reset_states.py", "keras3-reset-states", "metric.reset_states()", "reset_state()"),
    ("keras2_reduction.py", "keras3-loss-reduction", "keras.losses.Reduction.NONE", "reduction=None"),
    ("keras2_optimizer_lr.py", "keras3-optimizer-lr", "model.optimizer.lr", "optimizer.learning_rate"),
    ("out_of_memory.py", "out-of-memory", "tf.zeros(", "per-replica batch"),
    ("merge_call.py", "merge-call-in-nested-function", "optimizer.apply_gradients(", "@tf.function"),
    ("undistributed_dataset.py", "dataset-not-batched", "experimental_distribute_dataset(ds)", "batch"),
    ("tpu_resolver.py", "no-tpu-found", "TPUClusterResolver()", "tpu='local'"),
    *((script, signature, line, advice) for script, (signature, line, _, _, advice) in KERAS2.items()),
])
def test_crash_signature(tmp_path: Path, script: str, signature: str, line: str, advice: str) -> None:
    run_dir = tmp_path / "run"
    env = child_env(TPUWATCH_HOME=str(tmp_path / "home"))
    if signature == "tensorboard-not-installed":
        # the crash is real where tensorboard is not installed; where it is, hide it
        hide = tmp_path / "hide" / "tensorboard"
        hide.mkdir(parents=True)
        (hide / "__init__.py").write_text("raise ImportError('tensorboard hidden by the test')\n")
        env["PYTHONPATH"] = f"{hide.parent}:{env['PYTHONPATH']}"
    run = subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(run_dir),
                          str(CRASHES / script)], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 1, run.stderr[-3000:]
    out = subprocess.run([sys.executable, "-m", "tpuwatch", "report", str(run_dir), "--format", "json"],
                         capture_output=True, text=True, timeout=120, env=env, check=True)
    report = json.loads(out.stdout)
    (crash,) = [f for f in report["findings"] if f["rule"] == "script-crash"]
    assert crash["severity"] == "critical"
    assert crash["evidence"]["signature"] == signature, crash
    assert script in crash["evidence"]["script_line"] and line in crash["evidence"]["script_line"]
    assert advice in crash["advice"]
    tb = report["run"]["traceback"]
    assert script in tb and 'File "<frozen runpy>"' not in tb and "/tpuwatch/agent/" not in tb
    assert "frames of its own: <frozen runpy> and tpuwatch/agent)" in tb
    text = subprocess.run([sys.executable, "-m", "tpuwatch", "report", str(run_dir)],
                          capture_output=True, text=True, timeout=120, env=env, check=True).stdout
    assert "[critical] script-crash" in text and "Traceback" in text and 'File "<frozen runpy>"' not in text


@pytest.mark.parametrize("script", KERAS2)
def test_the_keras3_advice_applied_lets_the_script_run(tmp_path: Path, script: str) -> None:
    """The change each Keras 2 -> 3 finding advises, made to a copy of its script: it runs to its end."""
    _, _, keras2, keras3, _ = KERAS2[script]
    text = (CRASHES / script).read_text()
    assert text.count(keras2) == 1
    (tmp_path / "_common.py").write_text((CRASHES / "_common.py").read_text())
    (tmp_path / script).write_text(text.replace(keras2, keras3))
    run = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=child_env(TF_CPP_MIN_LOG_LEVEL="3"))
    assert run.returncode == 0, run.stderr[-3000:]


def _traceback_block(text: str) -> str:
    """From the last "Traceback (most recent call last):" to the end (TF's C++ log lines before it
    carry timestamps and pids), AutoGraph's generated file names (random per process) and the
    numbers TensorFlow gives traced functions (they count those traced before) made alike."""
    at = text.rfind("Traceback (most recent call last):")
    assert at >= 0, text[-3000:]
    text = re.sub(r"__autograph_generated_file\w+\.py", "__autograph_generated_fileX.py", text[at:])
    return re.sub(r"(\[Op:__inference_\w+?_)\d+\]", r"\1N]", text)


#: A custom loop whose tf.function is called with one argument too many: the TypeError comes through
#: the agent's patched step call (agent/steps.py) under tpuwatch.
BAD_CALL = """\
import tensorflow as tf

weights = tf.Variable(tf.ones([4, 1]))


@tf.function
def train_step(features, labels):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.matmul(features, weights) - labels) ** 2)
    weights.assign_sub(0.1 * tape.gradient(loss, weights))
    return loss


features, labels = tf.zeros([8, 4]), tf.zeros([8, 1])
for step in range(3):
    print("loss", float(train_step(features, labels)))
train_step(features, labels, 0.5)  # one argument too many
"""


#: A custom loop's tf.function that fails inside the graph at run time: TensorFlow's message lists
#: where the failing op was defined ("Detected at node ... defined at"), a stack it records while
#: tracing, through the agent's patched call and the runpy frames above the script.
GRAPH_NODE = """\
import tensorflow as tf

table = tf.Variable(tf.range(10, dtype=tf.float32))


@tf.function
def train_step(indices):
    picked = tf.gather(table, indices)
    return tf.reduce_sum(picked)


for step in range(3):
    print("sum", float(train_step(tf.constant([1, 2, 3]))))
print(float(train_step(tf.constant([1, 2, 30]))))  # an index past the table: fails inside the graph
"""

#: An error the script raises while AutoGraph converts its function (a retrace with a wrong shape).
AUTOGRAPH = """\
import tensorflow as tf


def scale(x):
    if x.shape[-1] != 4:
        raise ValueError(f"expected 4 features, got {x.shape[-1]}")
    return x * 2.0


@tf.function
def train_step(x):
    return tf.reduce_sum(scale(x))


print(float(train_step(tf.ones([2, 4]))))
print(float(train_step(tf.ones([2, 5]))))  # retraces, and scale raises while tracing
"""

#: A Keras fit whose layer fails inside the compiled step at run time (an id past its table).
KERAS_FIT = """\
import numpy as np
import keras
import tensorflow as tf


class Lookup(keras.layers.Layer):
    def build(self, input_shape):
        self.table = self.add_weight(shape=(10, 4), initializer="ones")

    def call(self, ids):
        return tf.gather(self.table, ids)


model = keras.Sequential([keras.Input((1,), dtype="int32"), Lookup(), keras.layers.Flatten(), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
ids = np.full((64, 1), 3, "int32")
ids[40] = 99
model.fit(ids, np.zeros((64, 1), "float32"), batch_size=8, epochs=1, shuffle=False, verbose=0)
"""

WRITTEN = {"bad_call.py": BAD_CALL, "graph_node.py": GRAPH_NODE, "autograph.py": AUTOGRAPH,
           "keras_fit.py": KERAS_FIT}


@pytest.mark.parametrize("script", ["keras2_optimizer_lr.py", *WRITTEN])
def test_the_scripts_traceback_is_byte_for_byte_a_plain_runs(tmp_path: Path, script: str) -> None:
    """Under tpuwatch output.log and stdout gained tpuwatch's frames (the agent's
    _run_script, <frozen runpy>, agent/steps.py's original(fn, ...)) and relative script paths.
    TensorFlow's own text too (its "defined at" stacks named the agent's and runpy's frames; a
    frame whose line TensorFlow's filter had left was printed at another line). The one difference
    left: the number TensorFlow gives a traced function (``__inference_train_step_15``) counts the
    functions traced before it, the agent's among them."""
    folder = CRASHES
    if script in WRITTEN:
        folder = tmp_path / "scripts"
        folder.mkdir()
        (folder / script).write_text(WRITTEN[script])
    env = child_env(TPUWATCH_HOME=str(tmp_path / "home"), TF_CPP_MIN_LOG_LEVEL="3")
    plain = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300, env=env,
                           cwd=folder)
    run_dir = tmp_path / "run"
    run = subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(run_dir), script],
                         capture_output=True, text=True, timeout=300, env=env, cwd=folder)
    assert plain.returncode == run.returncode == 1, run.stderr[-3000:]
    expected = _traceback_block(plain.stderr)
    assert f'File "{folder / script}"' in expected  # python names the script by its absolute path
    assert _traceback_block(run.stdout) == expected
    assert _traceback_block((run_dir / "output.log").read_text()) == expected


#: The Keras fit above, caught and printed by the script itself, then a tf.function's error too.
CAUGHT = KERAS_FIT.replace("model.fit(", "try:\n    model.fit(").replace(
    "verbose=0)\n", "verbose=0)\nexcept Exception:\n    traceback.print_exc()\n") + """

@tf.function
def pick(i):
    return tf.gather(tf.range(3), i)


try:
    pick(tf.constant(7))
except Exception:
    traceback.print_exc()
"""


def test_a_traceback_the_script_prints_itself_differs_only_by_the_wrappers_frames(tmp_path: Path) -> None:
    """What tpuwatch cannot avoid: the script catches the error and prints it itself; the agent's
    wrappers of fit and of a tf.function call, between the script and Keras' or TensorFlow's entry
    point, are a frame each (a Python function that raises is one). Everything below them (the
    step functions' patched calls inside fit, the "defined at" stacks) is as under plain python."""
    folder = tmp_path / "scripts"
    folder.mkdir()
    (folder / "caught.py").write_text("import traceback\n" + CAUGHT)
    env = child_env(TPUWATCH_HOME=str(tmp_path / "home"), TF_CPP_MIN_LOG_LEVEL="3")
    plain = subprocess.run([sys.executable, "caught.py"], capture_output=True, text=True, timeout=300, env=env,
                           cwd=folder)
    run_dir = tmp_path / "run"
    run = subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(run_dir),
                          "caught.py"], capture_output=True, text=True, timeout=300, env=env, cwd=folder)
    assert plain.returncode == run.returncode == 0, run.stderr[-3000:]

    def printed(text: str) -> str:
        at = text.find("Traceback (most recent call last):")
        assert at >= 0, text[-3000:]
        return re.sub(r"(\[Op:__inference_\w+?_)\d+\]", r"\1N]", text[at:])

    got = printed(run.stdout).splitlines(keepends=True)
    wrappers = [i for i, line in enumerate(got) if "/tpuwatch/agent/" in line]
    assert [re.search(r"agent/(\w+\.py)", got[i]).group(1) for i in wrappers] == ["checkpointing.py", "steps.py"]
    for i in reversed(wrappers):  # the frame's line, its source line and its carets
        del got[i:i + 3]
    assert "".join(got) == printed(plain.stderr)

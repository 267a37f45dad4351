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


def _traceback_block(text: str) -> str:
    """From the last "Traceback (most recent call last):" to the end (TF's C++ log lines before it
    carry timestamps and pids), AutoGraph's generated file names (random per process) made alike."""
    at = text.rfind("Traceback (most recent call last):")
    assert at >= 0, text[-3000:]
    return re.sub(r"__autograph_generated_file\w+\.py", "__autograph_generated_fileX.py", text[at:])


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


@pytest.mark.parametrize("script", ["keras2_optimizer_lr.py", "bad_call.py"])
def test_the_scripts_traceback_is_byte_for_byte_a_plain_runs(tmp_path: Path, script: str) -> None:
    """Issue 28 item 3: under tpuwatch output.log and stdout gained tpuwatch's frames (the agent's
    _run_script, <frozen runpy>, agent/steps.py's original(fn, ...)) and relative script paths.
    (Not covered: frames of the agent's patches inside the text of an AutoGraph or graph-node
    error message, which TensorFlow writes into the exception's message.)"""
    folder = CRASHES
    if script == "bad_call.py":
        folder = tmp_path / "scripts"
        folder.mkdir()
        (folder / script).write_text(BAD_CALL)
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

"""Steps/s of a script that prints once a step, plain vs under ``tpuwatch run`` with the run
directory on a slow disk.

The slow disk is real: an ext4 file system on a loop device, mounted ``sync`` (every write(2)
reaches the device before it returns, as on NFS with sync or a network file system), in a blkio
cgroup that lets the device take 20 writes a second: ~50 ms a write. Root only; everything is
undone at the end. This process and its children run in that cgroup; the throttle applies only
to the loop device.

The script: a small Keras model trained by a ``tf.function`` step on synthetic data, printing its
loss every step; it measures its own steps/s after a warm-up and writes it to a file on the fast
disk. Runs, interleaved, ``--repeats`` times each:

- ``plain``: ``python train.py > fast-disk/out.log``;
- ``plain-slow``: ``python train.py > slow-disk/out.log`` (what the slow disk does without tpuwatch);
- ``tpuwatch``: ``tpuwatch run --headless --run-dir slow-disk/run train.py``;
- ``tpuwatch-fast``: the same with the run directory on the fast disk (what the output pump costs);
- ``tpuwatch-before``, ``tpuwatch-before-fast`` with ``--before DIR`` (a tpuwatch checkout, e.g.
  ``git archive main``): the same under that tpuwatch.

Prints the median steps/s of each, the ratios to plain and the load average. Asserts nothing.

    sudo .venv/bin/python bench/slow_run_dir.py [--steps 200] [--repeats 3] [--before /tmp/tw-main]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CGROUP = Path("/sys/fs/cgroup/blkio/tpuwatch-bench-slow-disk")
WRITES_PER_S = 20

SCRIPT = """
import json, sys, time
import numpy as np
import tensorflow as tf
import keras

steps, warmup, result = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
optimizer = keras.optimizers.SGD(0.01)
x = tf.constant(np.random.default_rng(0).normal(size=(64, 32)), tf.float32)
y = tf.reduce_sum(x, axis=1, keepdims=True)

@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

for step in range(steps + warmup):
    if step == warmup:
        t0 = time.perf_counter()
    loss = train_step(x, y)
    print(f"step {step} loss {float(loss):.5f}")
rate = steps / (time.perf_counter() - t0)
with open(result, "w") as f:
    json.dump({"steps_per_s": rate}, f)
"""


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def env_for(tpuwatch_dir: Path | None) -> dict:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if tpuwatch_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tpuwatch_dir), env.get("PYTHONPATH", "")])
    return env


def run_once(mode: str, script: Path, fast: Path, slow: Path, n: int, a: argparse.Namespace) -> float:
    result = fast / f"{mode}-{n}.json"
    args = [str(script), str(a.steps), str(a.warmup), str(result)]
    if mode.startswith("plain"):
        out_dir = slow if mode == "plain-slow" else fast
        with open(out_dir / f"{mode}-{n}.log", "wb") as out:
            subprocess.run([sys.executable, *args], stdout=out, stderr=subprocess.STDOUT, env=env_for(None),
                           check=True, timeout=600, cwd=fast)
    else:
        where = Path(a.before) if mode.startswith("tpuwatch-before") else ROOT
        disk = fast if mode.endswith("-fast") else slow
        subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(disk / f"{mode}-{n}"),
                        *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env_for(where),
                       check=True, timeout=600, cwd=fast)  # not here: `-m` would import this checkout first
    return json.loads(result.read_text())["steps_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before", help="a tpuwatch checkout to compare with (its tpuwatch run)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/slow_run_dir.py: needs root (a loop device, a mount and a blkio cgroup); run it with sudo")
    modes = ["plain", "plain-slow", "tpuwatch", "tpuwatch-fast"] + (
        ["tpuwatch-before", "tpuwatch-before-fast"] if a.before else [])
    with tempfile.TemporaryDirectory() as tmp:
        fast, slow, image = Path(tmp) / "fast", Path(tmp) / "slow", Path(tmp) / "disk.img"
        fast.mkdir()
        slow.mkdir()
        with open(image, "wb") as f:
            f.truncate(256 << 20)
        sh("mkfs.ext4", "-q", "-F", str(image))
        loop = sh("losetup", "-f", "--show", str(image))
        try:
            sh("mount", "-o", "sync", loop, str(slow))
            CGROUP.mkdir(exist_ok=True)
            dev = Path(f"/sys/block/{Path(loop).name}/dev").read_text().strip()
            (CGROUP / "blkio.throttle.write_iops_device").write_text(f"{dev} {WRITES_PER_S}")
            (CGROUP / "cgroup.procs").write_text(str(os.getpid()))
            script = fast / "train.py"
            script.write_text(textwrap.dedent(SCRIPT))
            rates: dict[str, list[float]] = {m: [] for m in modes}
            loads = []
            for n in range(a.repeats):
                for mode in modes:
                    rates[mode].append(run_once(mode, script, fast, slow, n, a))
                    loads.append(os.getloadavg()[0])
        finally:
            root_cgroup = CGROUP.parent / "cgroup.procs"
            root_cgroup.write_text(str(os.getpid()))
            subprocess.run(["umount", str(slow)], capture_output=True)
            subprocess.run(["losetup", "-d", loop], capture_output=True)
            try:
                CGROUP.rmdir()
            except OSError:
                pass
    plain = statistics.median(rates["plain"])
    print(f"slow run dir: ext4 on {loop}, mounted sync, {WRITES_PER_S} writes/s (~{1000 / WRITES_PER_S:.0f} ms a write); "
          f"{a.steps} steps after {a.warmup}, print every step, {a.repeats} runs each (median)")
    for mode in modes:
        m = statistics.median(rates[mode])
        runs = ", ".join(f"{r:.1f}" for r in rates[mode])
        print(f"  {mode:16s} {m:8.1f} steps/s  ratio to plain {m / plain:.3f}  ({runs})")
    print(f"load average (1 min) during the runs: {min(loads):.2f}..{max(loads):.2f}; "
          f"now {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

"""The sample training scripts run with plain Python (no agent) and do what their switches say.

Every test starts real TensorFlow subprocesses (about 4-5 s of import each on this 2-core box),
so runs that do not depend on each other are started two at a time, and the settings are tiny.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_runs"
PLANTED = SAMPLES / "planted"
TIMEOUT_S = 180

pytestmark = pytest.mark.tf

# Counts real traces per tf.function name (this hook fires once per trace), then runs
# the script as `python script.py` would. Used only where the script cannot report it itself.
TRACE_COUNTING_RUNNER = r"""
import collections, json, os, re, runpy, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from tensorflow.python.eager.polymorphic_function import tracing_compilation as tc
counts = collections.Counter()
original = tc._create_concrete_function
def counting(*args, **kwargs):
    concrete = original(*args, **kwargs)
    name = concrete.name.decode() if isinstance(concrete.name, bytes) else str(concrete.name)
    counts[re.sub(r"^__inference_|_\d+$", "", name)] += 1
    return concrete
tc._create_concrete_function = counting
script, sys.argv = sys.argv[1], sys.argv[1:]
try:
    runpy.run_path(script, run_name="__main__")
    code = 0
except SystemExit as e:
    code = e.code or 0
print("TRACES " + json.dumps(counts), flush=True)
sys.exit(code)
"""


@dataclass(frozen=True)
class Finished:
    cmd: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float

    def check(self) -> "Finished":
        assert self.returncode == 0, (
            f"{' '.join(self.cmd[1:])} exited {self.returncode}\n--- stdout\n{self.stdout[-3000:]}"
            f"\n--- stderr\n{self.stderr[-3000:]}")
        return self


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def run_all(commands: list[tuple[list[str], dict[str, str] | None]], parallel: int = 2) -> list[Finished]:
    """Runs ``python <args>`` for each command, ``parallel`` at a time; results in input order."""
    pending = list(enumerate(commands))
    running: list[tuple[int, subprocess.Popen, float, tuple[str, ...]]] = []
    done: dict[int, Finished] = {}
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while pending or running:
            while pending and len(running) < parallel:
                i, (args, env) = pending.pop(0)
                cmd = (sys.executable, *args)
                proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(env), stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
                running.append((i, proc, time.monotonic(), cmd))
            i, proc, t0, cmd = running.pop(0)
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            done[i] = Finished(cmd, proc.returncode, out, err, time.monotonic() - t0)
    finally:
        for _, proc, _, _ in running:
            proc.kill()
            proc.wait()
    return [done[i] for i in range(len(commands))]


def run(*args: str, env: dict[str, str] | None = None) -> Finished:
    return run_all([(list(args), env)], parallel=1)[0].check()


def median_ms(stdout: str) -> float:
    m = re.search(r"median ([\d.]+) ms/step", stdout)
    assert m, stdout[-2000:]
    return float(m.group(1))


def read_loss_log(path: Path) -> list[tuple[int, float]]:
    rows = []
    for line in path.read_text().splitlines():
        step, loss = line.split(",")
        rows.append((int(step), float(loss)))
    return rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- keras_fit.py --------------------------------------------------------------------------------

def test_keras_fit_slow_input_trains_every_step_through_the_sleeping_pipeline():
    r = run("sample_runs/keras_fit.py", "--epochs", "1", "--steps-per-epoch", "12",
            "--slow-input", "--slow-input-ms", "120")
    assert "strategy: MirroredStrategy, 4 replicas, global batch 128" in r.stdout
    assert "done: 12 steps" in r.stdout
    # How long the steps took is not asserted (no timing asserts in tests): that a sleeping
    # pipeline is reported input-bound is tests/diagnostics/test_planted_scripts.py's job.
    assert median_ms(r.stdout) > 0


def test_keras_fit_short_is_the_quick_run_and_the_default_plants_a_late_input_slowdown():
    short, late = run_all([
        (["sample_runs/keras_fit.py", "--short"], None),
        # The default run's plant, brought forward: from batch 4 on every batch sleeps 120 ms.
        (["sample_runs/keras_fit.py", "--epochs", "1", "--steps-per-epoch", "20", "--slow-input-after", "4",
          "--slow-input-ms", "120"], None),
    ])
    short.check()
    assert "done: 10 steps" in short.stdout and "planted" not in short.stdout
    late.check()
    assert "planted: from batch 4 on the input pipeline sleeps 120 ms per batch" in late.stdout
    assert "done: 20 steps" in late.stdout


def test_keras_fit_ragged_batches_retrace_the_train_function():
    r = run("-c", TRACE_COUNTING_RUNNER, "sample_runs/keras_fit.py", "--epochs", "2",
            "--steps-per-epoch", "2", "--ragged-batches")
    sizes = [int(s) for s in re.findall(r"epoch \d+: global batch (\d+)", r.stdout)]
    assert len(sizes) == 2 and sizes[0] != sizes[1], r.stdout
    traces = json.loads(r.stdout.split("TRACES ", 1)[1].splitlines()[0])
    # Keras relaxes the shape on the second trace (reduce_retracing): exactly one extra trace.
    assert traces.get("multi_step_on_iterator") == 2, traces
    assert "done: 4 steps" in r.stdout


def test_keras_fit_steps_per_execution_on_one_device():
    r = run("sample_runs/keras_fit.py", "--replicas", "1", "--steps-per-execution", "2",
            "--epochs", "1", "--steps-per-epoch", "4")
    assert "strategy: OneDeviceStrategy, 1 replicas, global batch 32" in r.stdout
    assert "done: 4 steps" in r.stdout


# --- custom_loop.py -------------------------------------------------------------------------------

def test_custom_loop_loss_log_and_iterator_in_function_agree(tmp_path):
    plain_log, inner_log = tmp_path / "plain.csv", tmp_path / "inner.csv"
    plain, inner = run_all([
        (["sample_runs/custom_loop.py", "--steps", "6", "--loss-log", str(plain_log)], None),
        (["sample_runs/custom_loop.py", "--steps", "6", "--iterator-in-function", "--steps-per-call", "3",
          "--slow-input", "--slow-input-ms", "120", "--loss-log", str(inner_log)], None),
    ])
    plain.check()
    inner.check()
    rows = read_loss_log(plain_log)
    assert [s for s, _ in rows] == [1, 2, 3, 4, 5, 6]
    assert all(math.isfinite(v) and 0 < v < 10 for _, v in rows), rows
    # Each printed loss is the logged one, rounded.
    printed = [float(v) for v in re.findall(r"loss ([\d.]+)", plain.stdout)]
    assert printed == [round(v, 4) for _, v in rows]
    # Same seed, same data order: three steps per call trains exactly like one step per call.
    inner_rows = read_loss_log(inner_log)
    assert [s for s, _ in inner_rows] == [1, 2, 3, 4, 5, 6]
    assert [v for _, v in inner_rows] == pytest.approx([v for _, v in rows], rel=1e-5)
    assert "traced 1 time(s)" in inner.stdout


def test_custom_loop_ragged_batches_give_several_shapes_and_retraces(tmp_path):
    log = tmp_path / "ragged.csv"
    r = run("sample_runs/custom_loop.py", "--steps", "8", "--ragged-batches", "--loss-log", str(log))
    sizes = {int(n) for n in re.findall(r"step +\d+ +batch +(\d+)", r.stdout)}
    assert len(sizes) >= 3, r.stdout
    m = re.search(r"batch sizes \[([\d, ]+)\], step function traced (\d+) time", r.stdout)
    assert m, r.stdout
    assert {int(s) for s in m.group(1).split(",")} == sizes
    assert int(m.group(2)) == len(sizes)  # one trace per distinct batch shape
    assert len(read_loss_log(log)) == 8


# --- multi_worker.py ------------------------------------------------------------------------------

def test_multi_worker_two_local_workers_with_a_straggler(tmp_path):
    ports = [free_port(), free_port()]
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    slow_ms = 150
    commands = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        commands.append((["sample_runs/multi_worker.py", "--steps", "5", "--slow-worker", "1",
                          "--slow-ms", str(slow_ms), "--loss-log", str(tmp_path / f"w{index}.csv")],
                         {"TF_CONFIG": tf_config}))
    workers = [w.check() for w in run_all(commands, parallel=2)]
    assert "worker 0 of 2: 2 replicas in sync" in workers[0].stdout
    logs = [read_loss_log(tmp_path / f"w{i}.csv") for i in range(2)]
    assert [s for s, _ in logs[0]] == [1, 2, 3, 4, 5]
    assert logs[0] == logs[1]  # the all-reduced loss is the same on both workers
    # Worker 1 sleeps per batch and worker 0 waits for it in every all-reduce; both print a median.
    for w in workers:
        assert median_ms(w.stdout) > 0, w.stdout


# --- planted/ (run plain once; the diagnostics tests run them under the agent) -------------------

def test_planted_scripts_run_plain_and_show_their_problem():
    runs = dict(zip(
        ["healthy_fit", "healthy_custom_loop", "input_bound", "loss_nonfinite", "replica_loss_skew",
         "stall", "step_time_jitter", "host_memory_growth", "retrace_storm", "function_recreated"],
        run_all([
            (["sample_runs/planted/healthy_fit.py", "--epochs", "1", "--steps-per-epoch", "3"], None),
            (["sample_runs/planted/healthy_custom_loop.py", "--steps", "5"], None),
            (["sample_runs/planted/input_bound.py", "--epochs", "1", "--steps-per-epoch", "3"], None),
            (["sample_runs/planted/loss_nonfinite.py", "--steps", "5", "--nan-at-step", "3"], None),
            (["sample_runs/planted/replica_loss_skew.py", "--steps", "20"], None),
            (["sample_runs/planted/stall.py", "--steps", "2", "--steps-after", "1", "--stall-seconds", "1.5"], None),
            (["sample_runs/planted/step_time_jitter.py", "--steps", "40"], None),
            (["sample_runs/planted/host_memory_growth.py", "--minutes", "0.1", "--mb-per-step", "0.5"], None),
            (["sample_runs/planted/retrace_storm.py", "--steps", "4"], None),
            (["sample_runs/planted/function_recreated.py", "--steps", "3"], None),
        ]),
    ))
    for r in runs.values():
        r.check()
    assert "done: 3 steps" in runs["healthy_fit"].stdout
    assert "done: 5 steps" in runs["healthy_custom_loop"].stdout
    assert "done: 3 steps" in runs["input_bound"].stdout

    losses = re.findall(r"step (\d+) +loss (\S+)", runs["loss_nonfinite"].stdout)
    assert [(int(s), v == "nan") for s, v in losses] == [(1, False), (2, False), (3, True), (4, True), (5, True)]

    last = re.findall(r"per replica \[([\d. ]+)\]", runs["replica_loss_skew"].stdout)[-1]
    per_replica = [float(v) for v in last.split()]
    assert len(per_replica) == 4
    assert per_replica[2] > 1.3 * max(per_replica[:2] + per_replica[3:]), per_replica

    m = re.search(r"gave up after ([\d.]+) s", runs["stall"].stdout)
    assert m and float(m.group(1)) >= 1.5
    assert "done: 3 steps" in runs["stall"].stdout

    m = re.search(r"p95/p50 ([\d.]+)\), (\d+) slow hook calls", runs["step_time_jitter"].stdout)
    assert m and float(m.group(1)) >= 2.0 and int(m.group(2)) >= 3, runs["step_time_jitter"].stdout

    m = re.search(r"done: (\d+) steps, kept (\d+) MB", runs["host_memory_growth"].stdout)
    assert m and int(m.group(1)) >= 5 and abs(int(m.group(2)) - 0.5 * int(m.group(1))) <= 1

    assert "train_step traced 4 times" in runs["retrace_storm"].stdout
    assert "3 train_step functions created" in runs["function_recreated"].stdout


def test_keras_fit_docstring_states_its_defaults_as_parse_args_has_them():
    """The docstring said the label noise keeps the loss above zero (it reached
    0.012 at accuracy 1.00) and "(default 600 on the default run" for a sleep in ms that is 150."""
    sys.path.insert(0, str(SAMPLES))
    try:
        import keras_fit
    finally:
        sys.path.remove(str(SAMPLES))
    doc = " ".join(keras_fit.__doc__.split())
    args = keras_fit.parse_args([])
    assert f"``--slow-input-ms`` ({args.slow_input_ms:.0f} ms unless given)" in doc, doc
    assert f"N defaults to {args.slow_input_after}" in doc, doc
    assert f"from step {args.slow_input_after} on" in doc
    assert "above zero" not in doc and "learns them too" in doc  # what a user sees at the end
    help_text = " ".join(subprocess.run([sys.executable, str(SAMPLES / "keras_fit.py"), "--help"], capture_output=True,
                                        text=True, timeout=TIMEOUT_S).stdout.split())
    assert "never reaches 0" not in help_text and "--label-noise" in help_text

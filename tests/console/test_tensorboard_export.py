"""``--tensorboard``: tpuwatch's series as TensorBoard scalars, read back with TensorBoard's own
event reader and compared with the recording, point by point."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import struct
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tpuwatch.protocol import DeviceSample, HostSample, Step, StepLoss
from tpuwatch_testing import ROOT, SAMPLES, child_env, read_messages

DATA = ROOT / "tests" / "data"
#: Where .ci/run puts tensorboard: off the test environment, whose crash sample
#: (sample_runs/crashes/tensorboard_missing.py) needs TensorFlow without it.
SITE = ROOT / ".tensorboard-site"


def _tensorboard_path() -> str:
    """The folder to put on PYTHONPATH for tensorboard ("" when it is importable as it is)."""
    if (SITE / "tensorboard").is_dir():
        return str(SITE)
    if importlib.util.find_spec("tensorboard") is not None:
        return ""
    if os.environ.get("CI") == "true":
        pytest.fail("CI must have tensorboard in .tensorboard-site (.ci/run installs it)")
    pytest.skip("tensorboard is not installed: pip install --no-deps --target .tensorboard-site tensorboard")


def _env(tb: str, **extra: str) -> dict:
    env = child_env(**extra)
    if tb:
        env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], tb])
    return env


def _scalars(folder: Path, tb: str) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar series in ``folder``, read by TensorBoard's event accumulator:
    {tag: [(step, value, wall_time)]}."""
    if tb and tb not in sys.path:
        sys.path.append(tb)
    # TensorBoard's own switch to its TF stub: the reader needs no TensorFlow either.
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _f32(x: float) -> float:
    """``x`` as TensorBoard keeps a scalar (float32)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _expected(messages: list) -> dict[str, list[tuple[int, float, float]]]:
    """What each series must hold, straight from the recording."""
    out: dict[str, list] = {}

    def put(tag, step, value, t):
        out.setdefault(tag, []).append((step, _f32(value), t))

    step = 0
    for m in messages:
        if isinstance(m, (Step, StepLoss)):
            if isinstance(m, Step):
                step = m.step
                put("tpuwatch/step_time_seconds", m.step, m.step_time_s, m.t)
                if m.input_wait_s is not None:
                    put("tpuwatch/input_wait_seconds", m.step, m.input_wait_s, m.t)
            if m.loss is not None:
                put("tpuwatch/loss", m.step, m.loss, m.t)
            for i, v in enumerate(m.replica_losses):
                put(f"tpuwatch/replica_loss/{i}", m.step, v, m.t)
        elif isinstance(m, HostSample):
            put("tpuwatch/host_rss_bytes", step, m.rss_bytes, m.t)
        elif isinstance(m, DeviceSample):
            device = re.sub(r"[^A-Za-z0-9_.\-]+", "_", m.device.rsplit("/", 1)[-1].removeprefix("device:"))
            put(f"tpuwatch/device_memory_bytes/{device}", step, m.current_bytes, m.t)
    return out


def _same(got: dict, expected: dict) -> None:
    assert sorted(got) == sorted(expected)
    for tag, points in expected.items():
        assert [(s, v) for s, v, _ in got[tag]] == [(s, v) for s, v, _ in points], tag
        assert [t for *_, t in got[tag]] == pytest.approx([t for *_, t in points], abs=1e-6), tag


def test_export_writes_every_series_of_a_recording_without_tensorflow(tmp_path):
    tb = _tensorboard_path()
    run_dir = tmp_path / "runs" / "r-healthy"
    run_dir.mkdir(parents=True)
    shutil.copy(DATA / "healthy_4replica.jsonl", run_dir / "events.jsonl")
    logdir = tmp_path / "logs"
    check = ("import sys; from tpuwatch.cli import main; code = main(sys.argv[1:]); "
             "assert not [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')], 'TF imported'; "
             "sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", check, "export", str(run_dir), "--tensorboard", str(logdir)],
                          capture_output=True, text=True, timeout=120, env=_env(tb))
    assert proc.returncode == 0, proc.stderr
    folder = logdir / "tpuwatch-r-healthy"
    expected = _expected(read_messages(run_dir / "events.jsonl"))
    # step time, input wait, loss, 4 replicas' losses, host RSS, each device's memory
    assert len(expected) > 8 and len(expected["tpuwatch/replica_loss/3"]) == 300
    assert f"wrote {sum(map(len, expected.values())):,} scalars in {len(expected)} series to {folder}" in proc.stderr
    _same(_scalars(folder, tb), expected)
    again = subprocess.run([sys.executable, "-m", "tpuwatch", "export", str(run_dir), "--tensorboard", str(logdir)],
                           capture_output=True, text=True, timeout=120, env=_env(tb))
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "already holds" in again.stderr


def test_without_tensorboard_it_says_how_to_get_it_in_one_line(tmp_path):
    hide = tmp_path / "hide" / "tensorboard"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    shutil.copy(DATA / "healthy_4replica.jsonl", run_dir / "events.jsonl")
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(hide.parent), env["PYTHONPATH"]])
    option = ["--tensorboard", str(tmp_path / "logs")]
    for args in (["export", str(run_dir), *option], ["run", "--headless", *option, str(tmp_path / "train.py")]):
        proc = subprocess.run([sys.executable, "-m", "tpuwatch", *args], capture_output=True, text=True,
                              timeout=60, env=env)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and "pip install 'tpuwatch[tensorboard]'" in proc.stderr


@pytest.mark.tf
@pytest.mark.slow
def test_a_live_run_writes_the_scalars_as_it_goes(tmp_path):
    tb = _tensorboard_path()
    run_dir, logdir = tmp_path / "run", tmp_path / "logs"
    proc = subprocess.run(
        [sys.executable, "-m", "tpuwatch", "run", "--headless", "--tensorboard", str(logdir), "--run-dir",
         str(run_dir), str(SAMPLES / "planted" / "stall_fast_loop.py"), "--steps", "100", "--hang-seconds", "0",
         "--replicas", "2"],
        capture_output=True, text=True, timeout=240, env=_env(tb, TPUWATCH_HOME=str(tmp_path / "home")))
    assert proc.returncode == 0, proc.stderr
    got = _scalars(logdir / "tpuwatch-run", tb)
    _same(got, _expected(read_messages(run_dir / "events.jsonl")))
    loss = {s: v for s, v, _ in got["tpuwatch/loss"]}
    printed = re.findall(r"^step (\d+)  loss (\S+)$", proc.stdout, re.M)  # what the script prints
    assert [int(step) for step, _ in printed] == [50, 100]
    for step, value in printed:
        assert loss[int(step)] == pytest.approx(float(value), abs=5e-5)
    assert len(got["tpuwatch/step_time_seconds"]) == 100
    assert {"tpuwatch/replica_loss/0", "tpuwatch/replica_loss/1"} <= set(got)


def test_export_into_a_place_it_cannot_write_is_one_line(tmp_path):
    # Found by a review: an OSError while writing LOGDIR printed a traceback.
    env = _env(_tensorboard_path())
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(ROOT / "tests" / "data" / "healthy_4replica.jsonl", run / "events.jsonl")
    logdir = tmp_path / "logs"
    logdir.mkdir()
    (logdir / "tpuwatch-run").write_text("a file where the run's folder goes\n")
    r = subprocess.run([sys.executable, "-m", "tpuwatch", "export", str(run), "--tensorboard", str(logdir)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr

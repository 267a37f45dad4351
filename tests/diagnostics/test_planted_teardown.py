"""End to end: TensorFlow's iterator teardown at a custom loop's epoch boundaries and at the
script's end (``sample_runs/planted/teardown_epoch.py``: deleting an iterator whose next batch
is still being decoded by a ``tf.numpy_function`` waits for it, the process idle), run under
``tpuwatch run --headless``. The ledger books each pause as *iterator teardown*, within 10 % or
0.5 s of the script's own clock, not as host time; the report says what it is, with the line.
The pause is TensorFlow's: plain ``python`` pauses the same. Real TensorFlow, real subprocesses
(about 20 s and 12 s)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tpuwatch_testing import SAMPLES, child_env

pytestmark = [pytest.mark.tf]
SCRIPT = SAMPLES / "planted" / "teardown_epoch.py"


def test_the_pauses_at_epoch_boundaries_and_the_end_are_named_iterator_teardown(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = child_env(TPUWATCH_HOME=str(tmp_path / "home"))
    run = subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(run_dir),
                          str(SCRIPT), "--epochs", "2", "--pause-s", "3", "--exit-pause-s", "3"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    boundaries = [float(v) for v in re.findall(r"^planted teardown_s=([\d.]+)$", run.stdout, re.M)]
    (at_exit,) = [float(v) for v in re.findall(r"^planted exit_teardown_s=([\d.]+)$", run.stdout, re.M)]
    assert len(boundaries) == 2 and min(boundaries + [at_exit]) > 2.0, (boundaries, at_exit)  # real, by its clock
    report = json.loads(subprocess.run(
        [sys.executable, "-m", "tpuwatch", "report", str(run_dir), "--format", "json"],
        capture_output=True, text=True, timeout=120, env=env, check=True).stdout)
    lg = report["ledger"]
    b = lg["buckets_s"]
    assert abs(sum(b.values()) - lg["wall_s"]) <= 1e-6 * lg["wall_s"]
    planted = sum(boundaries) + at_exit
    assert abs(b["teardown"] - planted) <= max(0.1 * planted, 0.5), (b, boundaries, at_exit)
    assert b["host"] < 2.0, b  # the pauses are no longer host time
    epochs = [n for n in lg["teardowns"] if not n["after_last"]]
    ends = [n for n in lg["teardowns"] if n["after_last"]]
    # the first epoch's end; the last epoch's and the script's, after the last step
    assert [n["step"] for n in epochs] == [20] and [n["step"] for n in ends] == [40, 40], lg["teardowns"]
    for n in lg["teardowns"]:
        assert n["cpu_share"] < 0.2 and n["iterator"] == "OwnedMultiDeviceIterator", n
    assert epochs[0]["stack"][0].startswith("teardown_epoch.py:") and ": break" in epochs[0]["stack"][0]
    assert ": break" in ends[0]["stack"][0]
    # main's frame is being freed with its locals: the line is its caller's
    assert ends[1]["stack"][0].startswith("teardown_epoch.py:") and ": code = main()" in ends[1]["stack"][0]
    text = subprocess.run([sys.executable, "-m", "tpuwatch", "report", str(run_dir), "--format", "text"],
                          capture_output=True, text=True, timeout=120, env=env, check=True).stdout
    assert re.search(r"^\s*iterator teardown\s+[\d.]+ s\s+[\d.]+%$", text, re.M), text  # its row
    assert re.search(r"after step 40 \(the last\), \d+% CPU", text) and re.search(r"after step 20, \d+% CPU", text)
    assert "waits, idle, for tf.data's own threads" in text
    assert "teardown_epoch.py:" in text and ": break" in text
    assert "host-bound" not in {f["rule"] for f in report["findings"]}


def test_plain_python_pauses_the_same_at_the_epoch_boundary(tmp_path: Path) -> None:
    env = child_env(TPUWATCH_HOME=str(tmp_path / "home"))
    run = subprocess.run([sys.executable, str(SCRIPT), "--epochs", "1", "--pause-s", "2.5"], cwd=SCRIPT.parent,
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (pause,) = [float(v) for v in re.findall(r"^planted teardown_s=([\d.]+)$", run.stdout, re.M)]
    assert pause >= 2.0, pause  # what is left of the slow batch (and any wait for the autotune thread)


def test_fit_dropping_its_iterator_as_it_returns_is_named_at_the_scripts_fit_line(tmp_path: Path) -> None:
    script = SCRIPT.with_name("teardown_fit.py")
    run_dir = tmp_path / "run"
    env = child_env(TPUWATCH_HOME=str(tmp_path / "home"))
    run = subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(run_dir),
                          str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (planted,) = [float(v) for v in re.findall(r"^planted fit_teardown_s=([\d.]+)$", run.stdout, re.M)]
    assert planted >= 2.0  # the pause is real, by the script's clock
    report = json.loads(subprocess.run(
        [sys.executable, "-m", "tpuwatch", "report", str(run_dir), "--format", "json"],
        capture_output=True, text=True, timeout=120, env=env, check=True).stdout)
    lg = report["ledger"]
    b = lg["buckets_s"]
    assert abs(sum(b.values()) - lg["wall_s"]) <= 1e-6 * lg["wall_s"]
    assert abs(b["teardown"] - planted) <= max(0.1 * planted, 0.5), (b, planted)
    (note,) = lg["teardowns"]
    assert note["after_last"] and note["step"] == 20 and note["iterator"] == "OwnedIterator", note
    # Keras' frame is innermost; the line quoted is the script's call into it
    assert "keras" not in note["site"] and note["site"].startswith("teardown_fit.py:"), note
    assert ": model.fit(ds, " in note["site"] and note["stack"][0] != note["site"], note

"""End to end: planted scripts with known amounts of evaluation, saving, sleeping and a
hang, run under `tpuwatch run --headless`; `tpuwatch report --format json` books each amount in
its ledger bucket (within 10% or 0.5 s of what the script's own clock printed), every ledger sums
to the wall time within 1%, a progressing evaluation or save is no stall, a real hang still is.
Real TensorFlow, real subprocesses."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tpuwatch_testing import SAMPLES, child_env

pytestmark = [pytest.mark.tf, pytest.mark.slow]
PLANTED = SAMPLES / "planted"


def _run(tmp_path: Path, script: str, *args: str) -> tuple[dict, dict[str, float], str]:
    run_dir = tmp_path / "run"
    env = child_env(TPUWATCH_HOME=str(tmp_path / "home"))
    env.pop("TPUWATCH_LOSS_EVERY_S", None)  # the default pacing, as users run it
    run = subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(run_dir),
                          str(PLANTED / script), *args], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    planted: dict[str, float] = {}
    for name, value in re.findall(r"^planted (\w+)=([\d.]+)$", run.stdout, re.M):
        planted[name] = planted.get(name, 0.0) + float(value)
    report = subprocess.run([sys.executable, "-m", "tpuwatch", "report", str(run_dir), "--format", "json"],
                            capture_output=True, text=True, timeout=120, env=env, check=True)
    return json.loads(report.stdout), planted, run.stderr


def _close(booked: float, planted: float) -> bool:
    return abs(booked - planted) <= max(0.1 * planted, 0.5)


def _check_sums(ledger: dict) -> dict[str, float]:
    b = ledger["buckets_s"]
    assert abs(sum(b.values()) - ledger["wall_s"]) <= 1e-6 * ledger["wall_s"]
    assert abs(b["unaccounted"]) <= 0.01 * ledger["wall_s"], b
    return b


def test_custom_loop_evaluation_save_and_hang(tmp_path):
    report, planted, headless = _run(tmp_path, "phases_custom_loop.py", "--hang-s", "12")
    b = _check_sums(report["ledger"])
    # The script's clock stops after its test loop ended, the loop's iterator deleted: TF can take
    # seconds deleting it under load (its tf.data threads wind down), which the ledger books as
    # iterator teardown at the loop's line, not as evaluating.
    loop = next(n for n, line in enumerate((PLANTED / "phases_custom_loop.py").read_text().splitlines(), 1)
                if "for batch in test_dist" in line)
    teardowns = report["ledger"]["teardowns"]
    eval_teardown = sum(n["seconds"] for n in teardowns if n["site"].startswith(f"phases_custom_loop.py:{loop} "))
    assert _close(b["evaluating"] + eval_teardown, planted["evaluating_s"]), f"{b} {teardowns} {planted}"
    assert _close(b["checkpointing"], planted["checkpointing_s"]), (b, planted)
    assert _close(b["stalled"], planted["hang_s"]), (b, planted)
    # starting: the interpreter, TensorFlow's import and the planted sleep
    assert planted["sleep_before_s"] <= b["starting"] <= planted["sleep_before_s"] + 30
    stalls = [f for f in report["findings"] if f["rule"] == "stall"]
    assert len(stalls) == 1, stalls  # the 12 s evaluation after step 30 progressed: not a stall
    assert stalls[0]["evidence"]["last_step"] == 60 and stalls[0]["evidence"].get("long_gaps", 1) == 1
    rows = {r["bucket"]: r for r in report["ledger"]["rows"]}
    assert rows["stalled"]["finding"] == "stall"
    assert "goodput" in headless and "evaluating" in headless


def test_fit_callbacks_validation_and_saves(tmp_path):
    report, planted, _ = _run(tmp_path, "phases_fit.py")
    b = _check_sums(report["ledger"])
    assert _close(b["evaluating"], planted["evaluating_s"]), (b, planted)
    assert _close(b["checkpointing"], planted["checkpointing_s"]), (b, planted)
    # everything between two training steps, by the script's clock, is in these buckets; the
    # sleeping callback is host time (beside Keras' own work between epochs: TF may take seconds
    # destroying the validation iterator, plain runs too)
    # (the host time after the last step, until the script returns, is not between two steps)
    host_between = b["host"] - report["ledger"]["host_after_last_s"]
    between = (host_between + b["evaluating"] + b["checkpointing"] + b["iterator"] + b["stalled"]
               + b.get("teardown", 0.0) - sum(n["seconds"] for n in report["ledger"]["teardowns"] if n["after_last"]))
    assert _close(between, planted["between_steps_s"]), (b, planted)
    assert b["host"] >= planted["callback_sleep_s"] - 0.5, (b, planted)
    assert planted["sleep_before_s"] <= b["starting"] <= planted["sleep_before_s"] + 30
    assert b["compiling"] > 0 and b["training"] > 0
    assert not [f for f in report["findings"] if f["rule"] == "stall"]

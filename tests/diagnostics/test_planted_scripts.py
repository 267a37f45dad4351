"""The diagnostics corpus, end to end: every planted script, run under `tpuwatch run --headless`,
yields its rule (with the right replica/function in the evidence) in `tpuwatch report`; the
healthy scripts yield no warning or critical finding. Real TensorFlow, real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tpuwatch_testing import SAMPLES, child_env

pytestmark = [pytest.mark.tf, pytest.mark.slow]
PLANTED = SAMPLES / "planted"


def _run_and_report(tmp_path: Path, script: str, *args: str, timeout: float = 420) -> dict:
    run_dir = tmp_path / "run"
    env = child_env(TPUWATCH_HOME=str(tmp_path / "home"))
    run = subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(run_dir),
                          str(PLANTED / script), *args], capture_output=True, text=True, timeout=timeout, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = subprocess.run([sys.executable, "-m", "tpuwatch", "report", str(run_dir), "--format", "json"],
                            capture_output=True, text=True, timeout=120, env=env, check=True)
    data = json.loads(report.stdout)
    data["_headless"] = run.stderr
    return data


def _alarms(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["severity"] in ("warning", "critical")]


@pytest.mark.parametrize("script, args, rule, evidence", [
    ("input_bound.py", (), "input-bound", {}),
    ("retrace_storm.py", (), "retrace-storm", {"function": "train_step"}),
    ("function_recreated.py", (), "function-recreated", {}),
    ("loss_nonfinite.py", (), "loss-nonfinite", {"replica": 1}),
    ("replica_loss_skew.py", (), "replica-loss-skew", {"replica": 2}),
    ("step_time_jitter.py", (), "step-time-jitter", {}),
    ("stall.py", (), "stall", {}),
    ("host_memory_growth.py", (), "host-memory-growth", {}),
])
def test_planted_script_yields_its_rule(tmp_path, script, args, rule, evidence):
    report = _run_and_report(tmp_path, script, *args)
    found = [f for f in report["findings"] if f["rule"] == rule]
    assert found, f"{rule} not found; findings: {[(f['rule'], f['severity']) for f in report['findings']]}"
    finding = max(found, key=lambda f: f["severity"] != "info")
    assert finding["severity"] in ("warning", "critical"), finding
    for key, value in evidence.items():
        assert finding["evidence"].get(key) == value, finding["evidence"]
    assert finding["message"] and finding["advice"]
    # Live too: the headless run printed it as it appeared.
    assert rule in report["_headless"]
    # The finding was recorded in the run's own recording by the process that owned the run.
    events = (tmp_path / "run" / "events.jsonl").read_text()
    assert f'"rule":"{rule}"' in events


@pytest.mark.parametrize("script", ["healthy_fit.py", "healthy_custom_loop.py"])
def test_healthy_scripts_raise_no_alarm(tmp_path, script):
    report = _run_and_report(tmp_path, script)
    assert report["summary"]["steps"] >= 30
    assert _alarms(report) == [], _alarms(report)

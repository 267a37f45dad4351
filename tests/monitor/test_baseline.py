"""`tpuwatch run --baseline RUN`: live deltas against a finished run's whole-run figures."""

from __future__ import annotations

import shutil
import subprocess
import sys

from monitor_recordings import DATA, mr

from tpuwatch.console.headless import progress_line
from tpuwatch.monitor.baseline import Baseline, deltas
from tpuwatch.monitor.state import RunState
from tpuwatch_testing import child_env


def _running(baseline: Baseline | None) -> RunState:
    s = RunState()
    s.baseline = baseline
    s.apply(mr.hello())
    s.apply(mr.topology(mr.T0))
    for m in mr.steps(100, t0=mr.T0 + 1, step_time_s=0.04):  # 25 steps/s, 64 examples a step
        s.apply(m)
    return s


def test_header_and_headless_line_show_the_deltas_against_the_baseline():
    from tpuwatch.ui.widgets.run_header import header_text

    base = Baseline(run_id="20250615-120000-train-ab12", step_p50_s=0.05, steps_per_s=20.0,
                    examples_per_s=1280.0, input_wait_share=0.10)
    state = _running(base)
    snap = state.snapshot(state.last_message_t)
    assert snap.status == "running"
    got = deltas(snap)
    assert got[0].startswith("vs ab12: p50 -") and any(p.startswith("steps/s +") for p in got)
    assert "vs ab12: p50" in header_text(snap, 200).plain
    assert "vs ab12: p50" in progress_line(snap)
    # no baseline, nothing added
    plain = _running(None).snapshot(state.last_message_t)
    assert deltas(plain) == [] and "vs " not in progress_line(plain)


def test_a_baseline_that_is_no_run_is_one_line_before_anything_starts(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    r = subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", "--baseline", str(tmp_path / "nope"),
                        str(script)], capture_output=True, text=True, timeout=60, env=child_env())
    assert r.returncode == 2 and "never runs" not in r.stdout
    (line,) = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert line.startswith("tpuwatch: --baseline ") and "Traceback" not in r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(DATA / "waiting.jsonl", empty / "events.jsonl")
    r = subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", "--baseline", str(empty),
                        str(script)], capture_output=True, text=True, timeout=60, env=child_env())
    assert r.returncode == 2 and "has no training steps to compare with" in r.stderr


def test_a_baseline_carries_its_goodput_ledger(tmp_path):
    from tpuwatch.commands.run import load_baseline
    from tpuwatch.console.report import build_report

    run = tmp_path / "base"
    run.mkdir()
    shutil.copy(DATA / "input_bound.jsonl", run / "events.jsonl")
    b = load_baseline(str(run))
    ledger = build_report(run)["ledger"]
    assert b.goodput == ledger["goodput"] and b.goodput is not None
    assert b.ledger_shares["input_wait"] == ledger["buckets_s"]["input_wait"] / ledger["wall_s"] > 0.5

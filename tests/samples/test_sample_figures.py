"""The sample scripts' figures under the real agent equal what the scripts themselves do."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tpuwatch.monitor.state import RunState
from tpuwatch.protocol import Step
from tpuwatch_testing import SAMPLES, child_env

pytestmark = [pytest.mark.tf, pytest.mark.slow]


def test_keras_fit_examples_per_s_stays_the_global_batch_times_steps_per_s(run_agent):
    # Past the agent's first 256 reads, records carry "examples": null (reads are
    # paced); they were counted as steps of no examples (411 ex/s where ~830 were expected).
    # The default read pacing, not the tests' read-everything setting.
    r = run_agent(SAMPLES / "keras_fit.py", "--epochs", "2", "--steps-per-epoch", "170",
                  "--slow-input-after", "0", env={"TPUWATCH_LOSS_EVERY_S": ""}, timeout=300)
    assert r.returncode == 0, r.output[-2000:]
    steps = r.steps
    assert steps[-1].step == 340
    assert any(m.examples is None for m in steps), "reads were not paced: nothing reproduced"
    assert {m.examples for m in steps if m.examples is not None} == {128}  # the script's global batch
    state = RunState()
    checked = 0
    for m in r.messages:
        state.apply(m)
        if isinstance(m, Step) and m.step >= 280 and m.step % 20 == 0:
            snap = state.snapshot(now=m.t)
            assert snap.steps_per_s and snap.examples_per_s
            assert snap.examples_per_s == pytest.approx(128 * snap.steps_per_s, rel=0.02), m.step
            checked += 1
    assert checked >= 3


def _agent_runs(tmp_path, runs: dict[str, list[str]], timeout: float = 300) -> dict[str, object]:
    """Starts every run under the real agent at once (the same load for each), waits for all."""
    procs = {}
    for name, args in runs.items():
        run_dir = tmp_path / name
        procs[name] = (run_dir, subprocess.Popen(
            [sys.executable, "-m", "tpuwatch.agent", "--run-dir", str(run_dir), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(), cwd=tmp_path))
    out = {}
    for name, (run_dir, p) in procs.items():
        text, _ = p.communicate(timeout=timeout)
        assert p.returncode == 0, text[-2000:]
        out[name] = run_dir
    return out


def test_compare_says_the_pipeline_fix_is_faster_with_how_much_and_the_interval(tmp_path):
    # Compare two runs of the input-bound sample before and after its pipeline fix
    # (--slow-input: a sleeping, unprefetched pipeline; the fix: the sample's own prefetched
    # pipeline), started together so they share the load. (Two real runs of one script started
    # together here differed by 25%, one process getting less CPU: a real difference, which
    # compare calls significant; "no significant difference" is tested on two recordings drawn
    # from one distribution, tests/monitor/test_compare.py.)
    common = [str(SAMPLES / "keras_fit.py"), "--epochs", "1", "--steps-per-epoch", "40", "--replicas", "2",
              "--slow-input-after", "0"]
    dirs = _agent_runs(tmp_path, {"before": [*common, "--slow-input", "--slow-input-ms", "60"], "after": common})
    r = subprocess.run([sys.executable, "-m", "tpuwatch", "compare", dirs["before"], dirs["after"]],
                       capture_output=True, text=True, timeout=120, env=child_env())
    assert r.returncode == 0, r.stderr
    assert re.search(r"step time median B - A: -[\d.]+ ms \(-\d+%; 95% CI -[\d.]+ ms \.\. -[\d.]+ ms\): "
                     r"B is faster, its median step [\d.]+x shorter than A's", r.stdout), r.stdout
    assert "only in A (not B): [warning] input-bound" in r.stdout


def test_run_with_a_baseline_shows_live_deltas_in_the_headless_lines(tmp_path):
    import shutil

    from tpuwatch_testing import ROOT

    base = tmp_path / "base"
    base.mkdir()
    shutil.copy(ROOT / "tests" / "data" / "healthy_4replica.jsonl", base / "events.jsonl")
    r = subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", "--every", "1", "--baseline",
                        str(base), "--run-dir", str(tmp_path / "run"), str(SAMPLES / "keras_fit.py"), "--epochs",
                        "1", "--steps-per-epoch", "60", "--replicas", "2", "--slow-input-after", "0",
                        "--slow-input", "--slow-input-ms", "60"],
                       capture_output=True, text=True, timeout=300, env=child_env())
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if "vs ab12: p50 +" in ln]
    assert lines, r.stderr[-3000:]
    assert re.search(r"vs ab12: p50 \+\d+% · steps/s -\d+% · ex/s -\d+% · input \+\d+ pt", lines[-1]), lines[-1]

"""Profiles requested while real training runs: from the shell, with XProf step markers, and how soon."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from actions_live import LiveRun

from tpuwatch import protocol
from tpuwatch.monitor import profile_summary
from tpuwatch_testing import child_env

pytestmark = pytest.mark.tf


def test_profile_from_the_shell_has_a_per_step_breakdown_and_starts_at_the_next_step(tmp_path):
    run = LiveRun(tmp_path, "--mode", "custom", "--sleep-ms", "20")
    try:
        run.wait_for_steps(3)
        cli = subprocess.run([sys.executable, "-m", "tpuwatch", "profile", str(run.run_dir), "--steps", "3"],
                             capture_output=True, text=True, timeout=120, env=child_env())
        # Latency from the request to the start of the capture, measured over a few requests.
        outcomes = [run.command("profile", steps=2) for _ in range(4)]
    finally:
        code = run.stop()
    assert code == 0, run.output()
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert "profile queued at step" in cli.stdout and "profile running at step" in cli.stdout, cli.stdout
    assert "profile done: captured 3 step(s)" in cli.stdout, cli.stdout
    assert "3 steps, step time" in cli.stdout and "xprof server --logdir=" in cli.stdout, cli.stdout

    result = next(m for m in run.messages() if isinstance(m, protocol.Result) and m.action == "profile")
    path = Path(result.details["path"])
    assert path.parent == run.run_dir / "profiles" / "plugins" / "profile"
    assert list(path.glob("*.xplane.pb")) and result.details["bytes"] > 0
    summary = profile_summary.summarize(path)
    first = result.details["step"]
    # One row per captured step, named by our markers: XProf has its per-step breakdown.
    assert [s.name for s in summary.steps] == [f"train {first + i}" for i in range(3)], summary.steps
    assert all(s.step_ms > 0 and s.parts_ms for s in summary.steps)
    assert summary.step_avg_ms and summary.step_avg_ms > 0
    assert summary.top_ops and summary.input_verdict in ("highly", "moderately", "not")

    latencies = []
    for o in outcomes:
        assert o.result.ok, o.result.message
        queued, running = o.states
        assert (queued.state, running.state) == ("queued", "running")
        # It starts at the next step boundary: at most one step after the one it was queued at,
        # and the first step captured is the one right after that boundary.
        assert running.step - queued.step <= 1, o.states
        assert o.result.details["step"] == running.step + 1
        latencies.append(running.t - o.sent_t)
    print(f"\nprofile request -> running: median {statistics.median(latencies) * 1000:.1f} ms, "
          f"max {max(latencies) * 1000:.1f} ms, steps waited {[o.states[1].step - o.states[0].step for o in outcomes]}")
    assert max(latencies) < 2.0, latencies

"""Failed actions are Results, never crashes: training goes on and the message says what to fix."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from actions_live import LiveRun

from tpuwatch import protocol
from tpuwatch.control.actions import send_and_wait
from tpuwatch.control.client import new_command
from tpuwatch_testing import child_env

pytestmark = pytest.mark.tf


def test_failures_are_results_and_training_goes_on(tmp_path):
    run = LiveRun(tmp_path, "--mode", "custom", "--sleep-ms", "10")
    try:
        run.wait_for_steps(2)
        blocker = run.run_dir / "a-file"
        blocker.write_text("not a directory")
        unwritable = run.command("checkpoint", dir=str(blocker / "ckpts")).result
        outside = run.command("checkpoint", dir=str(tmp_path / "elsewhere")).result
        bad = run.command("profile", steps=0).result
        # A capture long enough that a second request arrives while it runs.
        started = threading.Event()
        long = {}

        def capture() -> None:
            long["outcome"] = send_and_wait(run.run_dir, new_command("profile", ms=3000), 60,
                                            on_state=lambda s: s.state == "running" and started.set())

        worker = threading.Thread(target=capture)
        worker.start()
        assert started.wait(30), run.output()
        second = run.command("profile").result
        worker.join(60)
        good = run.command("checkpoint").result
        run.wait_for_steps(good.details["step"] + 3)  # and training goes on after all of it
    finally:
        code = run.stop()
    assert code == 0, run.output()
    assert not unwritable.ok and "cannot create" in unwritable.message and "choose a directory" in unwritable.message
    assert not outside.ok and "--allow-dest" in outside.message
    assert not bad.ok and "steps=0" in bad.message and "between 1" in bad.message
    assert not second.ok and "already running" in second.message and "wait for its result" in second.message
    first = long["outcome"].result
    assert first.ok and first.details["seconds"] >= 3.0, first  # the first capture still finished
    assert first.details["stopped_by"] in ("time", "timer")
    assert good.ok, good.message
    # Exactly one Result per command.
    results = [m for m in run.messages() if isinstance(m, protocol.Result)]
    assert len(results) == len({r.id for r in results}) == 6


@pytest.mark.slow
def test_a_queued_checkpoint_says_why_it_waits_and_gives_up_at_its_timeout(tmp_path):
    """`checkpoint queued at step 30`, then nothing for 150 s while the run
    evaluated. Now: one line on why (no training step for a while, what the run does instead),
    and at --timeout one line and exit 1; there is no cancel, so the agent still saves at the next
    step boundary and that late result is in the recording (the CLI has stopped waiting)."""
    run = LiveRun(tmp_path, "--mode", "custom", "--sleep-ms", "20000")  # each step then 20 s of "evaluation"
    try:
        run.wait_for_steps(1)
        cli = subprocess.run([sys.executable, "-m", "tpuwatch", "checkpoint", str(run.run_dir), "--timeout", "9"],
                             capture_output=True, text=True, timeout=120, env=child_env())
        assert cli.returncode == 1, (cli.stdout, cli.stderr)
        assert "checkpoint queued at step 1" in cli.stdout, cli.stdout
        waits = [line for line in cli.stdout.splitlines() if "waits for the next training step" in line]
        assert len(waits) == 1 and "none since step 1" in waits[0], cli.stdout
        err = [line for line in cli.stderr.splitlines() if line.strip()]
        assert len(err) == 1 and "no result after --timeout 9 s (still queued)" in err[0] and "no cancel" in err[0], err
        late = None
        for _ in range(600):  # the next step comes about 20 s after the first
            late = next((m for m in run.messages() if isinstance(m, protocol.Result) and m.action == "checkpoint"), None)
            if late is not None:
                break
            time.sleep(0.1)
        assert late is not None and late.ok and late.details["step"] >= 1, run.output()
    finally:
        # the stop lands in a 20 s sleep; then the loop's `break` deletes the tf.data iterator
        # (with tf.data's autotune thread, whose sleep grows towards 60 s in an iterator this old,
        # that took >70 s in a full test lane, then >180 s in one with a busy process beside it:
        # the trainer turns autotune off)
        run.stop(timeout=180)

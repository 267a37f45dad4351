"""Failed actions are Results, never crashes: training goes on and the message says what to fix."""

from __future__ import annotations

import threading

import pytest
from actions_live import LiveRun

from tpuwatch import protocol
from tpuwatch.control.actions import send_and_wait
from tpuwatch.control.client import new_command

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

"""Checkpoints requested while real training runs (4 replicas, MirroredStrategy on logical CPUs)."""

from __future__ import annotations

import time

import pytest
from actions_live import LiveRun, restore, weights_by_iteration

from tpuwatch import protocol
from tpuwatch.agent import transport

pytestmark = pytest.mark.tf


def test_fifty_checkpoints_each_restore_to_the_weights_of_their_own_step(tmp_path):
    log = tmp_path / "weights.txt"
    run = LiveRun(tmp_path, "--mode", "custom", "--weights-log", str(log), "--sleep-ms", "2")
    try:
        run.wait_for_steps(2)
        results = []
        for i in range(50):
            # back to back: the next request as the previous result arrives, within the command
            # budget all local viewers share (past its burst, commands are skipped: docs/remote.md)
            if i >= transport.COMMAND_BURST // 2:
                time.sleep(1.0 / transport.COMMANDS_PER_S)
            outcome = run.command("checkpoint")
            assert outcome.result.ok, outcome.result.message
            results.append(outcome.result)
    finally:
        code = run.stop()
    assert code == 0, run.output()
    steps = [r.details["step"] for r in results]
    assert steps == sorted(steps) and len(set(steps)) >= 10, steps  # taken while training went on
    saved = weights_by_iteration(log)
    restored = restore([r.details["path"] for r in results])
    assert len(restored) == 50
    for r, got in zip(results, restored):
        # The step counter, the optimizer's iterations and the weights all belong to one step...
        assert got["step"] == r.details["step"] == got["iterations"], (r, got["step"], got["iterations"])
        # ...and the weights are bit for bit those the script had after that step.
        assert got["weights"] == saved[got["iterations"]], r.details
        assert r.details["bytes"] > 0 and r.details["path"].startswith(str(run.run_dir / "checkpoints"))


@pytest.mark.parametrize("mode", ["fit", "own-manager"])
def test_fit_model_and_the_scripts_own_manager_are_what_gets_saved(tmp_path, mode):
    own_dir = tmp_path / "own"
    args = ["--mode", "fit"] if mode == "fit" else ["--mode", "custom", "--own-manager", str(own_dir)]
    run = LiveRun(tmp_path, *args, "--sleep-ms", "5")
    try:
        run.wait_for_steps(2)
        results = [run.command("checkpoint").result for _ in range(3)]
    finally:
        code = run.stop()
    assert code == 0, run.output()
    assert all(r.ok for r in results), [r.message for r in results]
    paths = [r.details["path"] for r in results]
    if mode == "fit":
        assert all(r.details["saved"] == "model, optimizer" for r in results)
        restored = restore(paths)
        assert [g["step"] for g in restored] == [r.details["step"] for r in results]
        assert [g["iterations"] for g in restored] == [r.details["step"] for r in results]
    else:
        # The script's own format, beside its directory (never through its manager, which would
        # rotate the script's own checkpoints out); the step is the checkpoint number.
        assert all(r.details["saved"] == "the script's tf.train.Checkpoint" for r in results)
        assert paths == [str(own_dir / "tpuwatch" / f"ckpt-{r.details['step']}") for r in results]
        restored = restore(paths, own=True)
        assert [g["iterations"] for g in restored] == [r.details["step"] for r in results]


def test_requested_checkpoints_never_rotate_the_scripts_own_out(tmp_path):
    """The script keeps its last 3 checkpoints (max_to_keep=3) and saved 3; a token holder asks
    for 3 more within a second. Before: they went through the script's manager, which deleted
    the script's ckpt-3, ckpt-6 and ckpt-9 (a way to destroy training progress at 5 a second)."""
    import tensorflow as tf

    own_dir = tmp_path / "own"
    run = LiveRun(tmp_path, "--mode", "custom", "--own-manager", str(own_dir), "--own-keep", "3",
                  "--own-save-at", "3,6,9", "--sleep-ms", "5")
    try:
        run.wait_for_steps(12)
        results = [run.command("checkpoint").result for _ in range(3)]
    finally:
        code = run.stop()
    assert code == 0, run.output()
    assert all(r.ok for r in results), [r.message for r in results]
    for step in (3, 6, 9):
        assert (own_dir / f"ckpt-{step}.index").exists(), sorted(p.name for p in own_dir.iterdir())
    assert tf.train.latest_checkpoint(str(own_dir)) == str(own_dir / "ckpt-9")  # the script's own index
    assert [r.details["path"] for r in results] == [str(own_dir / "tpuwatch" / f"ckpt-{r.details['step']}")
                                                    for r in results]
    restored = restore([r.details["path"] for r in results], own=True)
    assert [g["iterations"] for g in restored] == [r.details["step"] for r in results]


@pytest.mark.usefixtures("sigint_default")  # SIGINT must reach the processes it starts
def test_ctrl_c_during_a_checkpoint_save_still_gives_its_one_result_and_no_partial_files(tmp_path):
    """SIGINT (Ctrl-C on the training's terminal, or a stop) lands while a requested checkpoint is
    being written: the script gets its KeyboardInterrupt as it would without tpuwatch, the command
    still gets its one Result (failed, interrupted), and the save's temporary files are gone.
    Before: no Result at all, and ckpt-N_temp/ left behind."""
    import os
    import signal

    from tpuwatch.control.client import AgentClient, new_command
    from tpuwatch_testing import read_messages

    own_dir = tmp_path / "own"
    run = LiveRun(tmp_path, "--mode", "custom", "--own-manager", str(own_dir), "--big-mb", "512", "--sleep-ms", "5")
    try:
        run.wait_for_steps(2)
        command = new_command("checkpoint")
        client = AgentClient.for_run(run.run_dir)
        try:
            client.send(command)
        finally:
            client.close()
        deadline = time.monotonic() + 120
        while not list((own_dir / "tpuwatch").glob("*_temp*")):
            assert time.monotonic() < deadline and run.proc.poll() is None, run.output()
            time.sleep(0.002)
        os.kill(run.proc.pid, signal.SIGINT)
        code = run.proc.wait(120)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
        run.log.close()
    assert code == -signal.SIGINT, (code, run.output())  # as Python ends on an uncaught KeyboardInterrupt
    results = [m for m in read_messages(run.run_dir / "events.jsonl")
               if isinstance(m, protocol.Result) and m.id == command.id]
    assert len(results) == 1, results
    assert not results[0].ok and "interrupted" in results[0].message, results[0]
    assert not list(own_dir.rglob("*_temp*")), sorted(p.name for p in own_dir.rglob("*"))


@pytest.mark.usefixtures("sigint_default")  # SIGINT must reach the processes it starts
def test_ctrl_c_on_tpuwatch_checkpoint_says_the_run_still_does_it(tmp_path):
    """Ctrl-C while `tpuwatch checkpoint` waits for a queued save: one line saying the request
    stays with the run and where its one Result goes, exit 130. Before: a bare exit 130."""
    import signal
    import subprocess
    import sys

    from tpuwatch_testing import child_env

    run = LiveRun(tmp_path, "--mode", "custom", "--sleep-ms", "15000")  # a step boundary every 15 s
    try:
        run.wait_for_steps(1)
        client = subprocess.Popen([sys.executable, "-m", "tpuwatch", "checkpoint", str(run.run_dir)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
        assert client.stdout is not None
        first = client.stdout.readline()  # "tpuwatch: checkpoint queued", printed once the agent said so
        assert "checkpoint queued" in first, first
        client.send_signal(signal.SIGINT)
        out, err = client.communicate(timeout=60)
    finally:
        code = run.stop(timeout=120)
    assert client.returncode == 130, (out, err)
    assert "Traceback" not in err, err
    assert "interrupted: stopped waiting; the run still does it" in err and "tpuwatch report" in err, err
    assert code == 0, run.output()

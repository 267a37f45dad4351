"""End to end in a real terminal: tmux runs `tpuwatch run` on a real sample script to completion."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tmux_support import tmux, wait_for

from tpuwatch_testing import SAMPLES

pytestmark = pytest.mark.tf


def test_dashboard_in_tmux_shows_a_real_run_to_the_end(tmp_path, _isolated_home):
    assert shutil.which("tmux"), "tmux is required for the end-to-end test (.ci/run installs it)"
    session = f"tpuwatch-e2e-{os.getpid()}"
    run_dir = tmp_path / "run"
    exe = Path(sys.executable).parent / "tpuwatch"
    cmd = (f"cd {shlex.quote(str(tmp_path))} && TPUWATCH_HOME={shlex.quote(str(_isolated_home))} "
           f"TERM=xterm-256color {shlex.quote(str(exe))} run --run-dir {shlex.quote(str(run_dir))} "
           f"{shlex.quote(str(SAMPLES / 'keras_fit.py'))} --epochs 2 --steps-per-epoch 6; "
           f"echo TPUWATCH-EXIT=$?; sleep 30")
    tmux("new-session", "-d", "-s", session, "-x", "100", "-y", "32", cmd)
    screen = lambda: tmux("capture-pane", "-p", "-t", session)  # noqa: E731
    try:
        # The dashboard comes up before TensorFlow has even loaded in the child.
        wait_for(lambda s: "keras_fit.py" in s, 20, "the dashboard header", screen)
        text = wait_for(lambda s: "FINISHED" in s, 240, "the run to finish", screen)
        assert "MirroredStrategy" in text and "4×" in text
        assert "12" in text  # the step count (2 epochs x 6 steps)
        events = (run_dir / "events.jsonl").read_text()
        assert events.count('"kind":"step"') == 12
        # The run is over: q quits without the stop/detach dialog, and tpuwatch exits with 0.
        tmux("send-keys", "-t", session, "q")
        text = wait_for(lambda s: "TPUWATCH-EXIT=" in s, 20, "tpuwatch to exit", screen)
        assert "TPUWATCH-EXIT=0" in text
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def test_attach_checkpoint_result_reads_at_120x40_and_stop_ends_training(tmp_path, _isolated_home):
    """A run started headless elsewhere; `tpuwatch attach` in a 120x40 terminal: `c` saves a
    checkpoint whose result reads on screen (short path), then `q`, `s` stops the training for
    real: the grace periods are printed, the run ends with 130 (143 when the interrupt outlasts
    its grace) and is listed as stopped."""
    assert shutil.which("tmux"), "tmux is required for the end-to-end test (.ci/run installs it)"
    session = f"tpuwatch-e2e-attach-{os.getpid()}"
    run_dir = _isolated_home / "runs" / "e2e-stop"  # under the runs root: `tpuwatch ls` lists it
    exe = Path(sys.executable).parent / "tpuwatch"
    env = dict(os.environ, TPUWATCH_HOME=str(_isolated_home), TF_CPP_MIN_LOG_LEVEL="2")
    # Trains until stopped (50 x 100 steps is many minutes here); no planted slowdown.
    runner = subprocess.Popen([str(exe), "run", "--headless", "--run-dir", str(run_dir),
                               str(SAMPLES / "keras_fit.py"), "--epochs", "50", "--steps-per-epoch", "100",
                               "--slow-input-after", "0"],
                              cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                              stderr=open(tmp_path / "headless.err", "w"))  # noqa: SIM115 (closed with the process)
    screen = lambda: tmux("capture-pane", "-p", "-t", session)  # noqa: E731
    try:
        events = run_dir / "events.jsonl"
        wait_for(lambda _: events.exists() and '"kind":"step"' in events.read_text(), 240, "the first step")
        cmd = (f"cd {shlex.quote(str(tmp_path))} && TPUWATCH_HOME={shlex.quote(str(_isolated_home))} "
               f"TERM=xterm-256color {shlex.quote(str(exe))} attach {shlex.quote(str(run_dir))}; "
               f"echo ATTACH-EXIT=$?; sleep 60")
        tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "40", cmd)
        wait_for(lambda s: "RUNNING" in s, 60, "the attached dashboard", screen)
        tmux("send-keys", "-t", session, "c")
        text = wait_for(lambda s: "checkpoint done: checkpoints/ckpt-" in s, 120, "the checkpoint's result", screen)
        line = next(s for s in text.splitlines() if "checkpoint done:" in s)
        step = line.split("checkpoints/ckpt-", 1)[1].split()[0]
        assert list((run_dir / "checkpoints").glob(f"ckpt-{step}.*")), line  # the file it names exists
        tmux("send-keys", "-t", session, "q")
        wait_for(lambda s: "Stop training" in s, 20, "the quit dialog", screen)
        tmux("send-keys", "-t", session, "s")
        text = wait_for(lambda s: "ATTACH-EXIT=" in s, 60, "attach to stop the run and exit", screen)
        assert "sending SIGINT to the training process group; waiting up to 15 s" in text
        # 130: the interrupt ended it. Under CI's load, fit's unwinding of the KeyboardInterrupt
        # (tearing its distributed iterator down in C takes seconds even under plain python) once
        # outlasted the 15 s grace, and the stop escalated to SIGTERM as documented: 143. Either
        # way the same code is on screen, in attach's exit, the process's and run.json's.
        code = 143 if "sending SIGTERM" in text else 130
        assert f"training stopped (exit code {code})" in text and f"ATTACH-EXIT={code}" in text
        assert runner.wait(timeout=60) == code  # the training really ended, with that code
        meta = json.loads((run_dir / "run.json").read_text())
        assert (meta["state"], meta["exit_code"]) == ("stopped", code)
        ls = subprocess.run([str(exe), "ls"], env=env, capture_output=True, text=True, timeout=60).stdout
        assert any("stopped" in row and str(code) in row for row in ls.splitlines()), ls
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        if runner.poll() is None:
            runner.kill()
            runner.wait()

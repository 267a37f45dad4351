"""End to end in a real terminal: tmux runs `tpuwatch run` on a real sample script to completion."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpuwatch_testing import SAMPLES

pytestmark = pytest.mark.tf


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def _wait_for(predicate, timeout: float, what: str, screen=lambda: "") -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = screen()
        if predicate(text):
            return text
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; screen:\n{screen()}")


def test_dashboard_in_tmux_shows_a_real_run_to_the_end(tmp_path, _isolated_home):
    assert shutil.which("tmux"), "tmux is required for the end-to-end test (.ci/run installs it)"
    session = f"tpuwatch-e2e-{os.getpid()}"
    run_dir = tmp_path / "run"
    exe = Path(sys.executable).parent / "tpuwatch"
    cmd = (f"cd {shlex.quote(str(tmp_path))} && TPUWATCH_HOME={shlex.quote(str(_isolated_home))} "
           f"TERM=xterm-256color {shlex.quote(str(exe))} run --run-dir {shlex.quote(str(run_dir))} "
           f"{shlex.quote(str(SAMPLES / 'keras_fit.py'))} --epochs 2 --steps-per-epoch 6; "
           f"echo TPUWATCH-EXIT=$?; sleep 30")
    _tmux("new-session", "-d", "-s", session, "-x", "100", "-y", "32", cmd)
    screen = lambda: _tmux("capture-pane", "-p", "-t", session)  # noqa: E731
    try:
        # The dashboard comes up before TensorFlow has even loaded in the child.
        _wait_for(lambda s: "keras_fit.py" in s, 20, "the dashboard header", screen)
        text = _wait_for(lambda s: "FINISHED" in s, 240, "the run to finish", screen)
        assert "MirroredStrategy" in text and "4×" in text
        assert "12" in text  # the step count (2 epochs x 6 steps)
        events = (run_dir / "events.jsonl").read_text()
        assert events.count('"kind":"step"') == 12
        # The run is over: q quits without the stop/detach dialog, and tpuwatch exits with 0.
        _tmux("send-keys", "-t", session, "q")
        text = _wait_for(lambda s: "TPUWATCH-EXIT=" in s, 20, "tpuwatch to exit", screen)
        assert "TPUWATCH-EXIT=0" in text
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)

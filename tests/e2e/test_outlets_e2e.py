"""--metrics and --notify beside the dashboard, in a real terminal (tmux): the relay serves and
alerts while Textual has the screen, and what it has to say waits until the dashboard closes."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from tmux_support import tmux, wait_for

from tpuwatch_testing import SAMPLES

pytestmark = [pytest.mark.tf, pytest.mark.slow]


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()
    except OSError:
        return ""


def test_metrics_and_notify_beside_the_dashboard(tmp_path, _isolated_home):
    assert shutil.which("tmux"), "tmux is required for the end-to-end test (.ci/run installs it)"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    session = f"tpuwatch-outlets-{os.getpid()}"
    events = tmp_path / "events.jsonl"
    exe = Path(sys.executable).parent / "tpuwatch"
    cmd = (f"cd {shlex.quote(str(tmp_path))} && TPUWATCH_HOME={shlex.quote(str(_isolated_home))} "
           f"TERM=xterm-256color {shlex.quote(str(exe))} run --run-dir {shlex.quote(str(tmp_path / 'run'))} "
           f"--metrics 127.0.0.1:{port} --notify {shlex.quote(f'cat >> {events}')} "
           f"{shlex.quote(str(SAMPLES / 'keras_fit.py'))} --epochs 2 --steps-per-epoch 6; "
           f"echo TPUWATCH-EXIT=$?; sleep 30")
    tmux("new-session", "-d", "-s", session, "-x", "100", "-y", "32", cmd)
    screen = lambda: tmux("capture-pane", "-p", "-t", session)  # noqa: E731
    try:
        wait_for(lambda s: "FINISHED" in s, 240, "the run to finish", screen)
        # the dashboard is still open: the last figures are still served
        text = wait_for(lambda s: 'tpuwatch_run_status{status="finished"} 1.0' in s, 30, "the end on /metrics",
                         lambda: _scrape(port))
        (steps,) = [line for line in text.splitlines() if line.startswith("tpuwatch_steps_total{")]
        assert steps.endswith(" 12.0")  # 2 epochs x 6 steps
        wait_for(lambda s: events.exists() and '"kind": "end"' in events.read_text(), 30, "the end event")
        assert "notify:" not in screen()  # held while the dashboard has the screen
        tmux("send-keys", "-t", session, "q")
        text = wait_for(lambda s: "TPUWATCH-EXIT=" in s, 30, "tpuwatch to exit", screen)
        assert "TPUWATCH-EXIT=0" in text and "notify: 1 event(s) to 1 command(s)" in text
        (end,) = [json.loads(line) for line in events.read_text().splitlines()]
        assert (end["kind"], end["status"], end["step"], end["exit_code"]) == ("end", "finished", 12, 0)
        assert _scrape(port) == ""  # the server went with the process
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)

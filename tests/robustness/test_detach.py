"""The viewer goes away, training goes on: `tpuwatch run` in a real terminal (tmux), killed with
SIGKILL or hung up on mid-run; then `attach`, `ls`, and a training process killed by a signal."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from robust_terminal import (
    Tmux,
    have_tmux,
    tpuwatch_argv,
    wait_file_int,
    wait_gone,
    wait_meta,
)

from tpuwatch import protocol, rundir
from tpuwatch_testing import child_env, read_messages

pytestmark = [pytest.mark.tf, pytest.mark.skipif(not have_tmux(), reason="needs tmux (apt-get install tmux)")]

SCRIPT = Path(__file__).resolve().parent / "scripts" / "robust_train.py"


@pytest.fixture
def tmux(tmp_path):
    t = Tmux(tmp_path)
    yield t
    t.close()


def _start_run(tmux: Tmux, tmp_path: Path, *script_args: str) -> tuple[Path, Path, int]:
    run_dir = rundir.runs_root() / f"robust-{tmp_path.name}"  # where `ls` and `attach` look
    ready = tmp_path / "ready"
    ui_pid = tmux.start("run", tpuwatch_argv("run", "--run-dir", str(run_dir), str(SCRIPT), "--ready", str(ready),
                                             "--stop-file", str(tmp_path / "stop"), *script_args))
    return run_dir, ready, ui_pid


def _assert_complete_recording(run_dir: Path, after: int) -> list:
    """Every step the script ran is recorded (and it ran on past ``after``), and it exited 0."""
    found = re.search(r"trained (\d+) steps", (run_dir / "output.log").read_text())
    assert found, (run_dir / "output.log").read_text()[-2000:]
    trained = int(found.group(1))
    assert trained > after
    messages = read_messages(run_dir / "events.jsonl")
    steps = [m.step for m in messages if isinstance(m, protocol.Step)]
    assert steps == list(range(1, trained + 1)), steps
    exits = [m for m in messages if isinstance(m, protocol.Exit)]
    assert [(e.exit_code, e.source) for e in exits] == [(0, "agent")], exits
    return messages


def _finish_soon(tmp_path: Path, ready: Path) -> int:
    """Lets the script train a few more steps without any viewer, then end; returns the step
    it was at when the viewer went away."""
    at = int(ready.read_text())
    wait_file_int(ready, at + 5)
    (tmp_path / "stop").touch()
    return at


def _ls_state(run_id: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "tpuwatch", "ls"], capture_output=True, text=True,
                          env=child_env(), timeout=60)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(run_id)]
    assert len(lines) == 1, (proc.stdout, proc.stderr)
    return lines[0].split()[1]


def test_ui_killed_with_sigkill_mid_run_training_finishes_and_attach_shows_it(tmux, tmp_path):
    run_dir, ready, ui_pid = _start_run(tmux, tmp_path, "--steps", "1000000", "--step-sleep", "0.1")
    child = wait_meta(run_dir, "child_pid")
    wait_file_int(ready, 4)
    tmux.wait_for("run", "RUNNING", timeout=60)  # the dashboard is up and live
    os.kill(ui_pid, signal.SIGKILL)
    assert tmux.dead_status("run", timeout=10) == 128 + signal.SIGKILL  # the pane saw the UI die
    assert _ls_state(run_dir.name) == "running"
    at = _finish_soon(tmp_path, ready)
    wait_gone(child, timeout=120)
    _assert_complete_recording(run_dir, after=at)
    assert _ls_state(run_dir.name) == "finished"

    # attach afterwards (by run id) catches up from the recording and shows the finished run.
    tmux.start("attach", tpuwatch_argv("attach", run_dir.name))
    screen = tmux.wait_for("attach", "FINISHED", timeout=30)
    last = int(ready.read_text())
    assert f"step {last}" in screen
    tmux.keys("attach", "q")  # nothing runs: quitting asks nothing
    assert tmux.dead_status("attach", timeout=20) == 0


def test_hangup_mid_run_is_a_detach(tmux, tmp_path):
    run_dir, ready, ui_pid = _start_run(tmux, tmp_path, "--steps", "1000000", "--step-sleep", "0.1")
    child = wait_meta(run_dir, "child_pid")
    wait_file_int(ready, 4)
    tmux.wait_for("run", "RUNNING", timeout=60)
    tmux.kill_session("run")  # closes the pty: the kernel sends SIGHUP, like a dropped SSH link
    wait_gone(ui_pid, timeout=30)
    at = _finish_soon(tmp_path, ready)
    wait_gone(child, timeout=120)
    _assert_complete_recording(run_dir, after=at)
    assert _ls_state(run_dir.name) == "finished"


def test_training_killed_by_a_signal_shows_in_the_dashboard_and_run_exits_128_plus_n(tmux, tmp_path):
    run_dir, ready, ui_pid = _start_run(tmux, tmp_path, "--steps", "100000", "--step-sleep", "0.2")
    child = wait_meta(run_dir, "child_pid")
    wait_file_int(ready, 3)
    tmux.wait_for("run", "RUNNING", timeout=60)
    os.kill(child, signal.SIGKILL)
    screen = tmux.wait_for("run", "CRASHED SIGKILL", timeout=30)  # shown while the dashboard is open
    assert "RUNNING" not in screen.splitlines()[0]
    tmux.keys("run", "q")  # the run is over: quit asks nothing
    assert tmux.dead_status("run", timeout=30) == 128 + signal.SIGKILL
    messages = read_messages(run_dir / "events.jsonl")
    exits = [m for m in messages if isinstance(m, protocol.Exit)]
    assert [(e.exit_code, e.signal, e.source) for e in exits] == [(137, 9, "launcher")]
    meta = json.loads((run_dir / "run.json").read_text())
    assert (meta["state"], meta["exit_code"]) == ("crashed", 137)
    assert _ls_state(run_dir.name) == "crashed"


def test_stacks_key_on_a_hung_run_shows_the_hanging_line_then_stop_records_the_end(tmux, tmp_path):
    run_dir, ready, ui_pid = _start_run(tmux, tmp_path, "--steps", "1000", "--hang-after", "3")
    wait_file_int(ready, 3)
    tmux.wait_for("run", "RUNNING", timeout=60)
    tmux.keys("run", "s")
    screen = tmux.wait_for("run", "HANG-LINE", timeout=30)  # the hanging line, scrolled into view
    assert "Stacks of the training process" in screen and "in hang_here" in screen
    tmux.keys("run", "Escape")  # (alone: an escape followed at once by a key reads as alt+key)
    tmux.wait_until_gone("run", "Stacks of the training process")
    tmux.keys("run", "q")
    tmux.wait_for("run", "Training is still running", timeout=10)
    tmux.keys("run", "s")  # stop: SIGINT to the process group interrupts the hang
    assert tmux.dead_status("run", timeout=60) == 128 + signal.SIGINT
    screen = tmux.screen("run")
    assert "sending SIGINT to the training process group; waiting up to 15 s" in screen
    assert "exit code 130" in screen
    meta = json.loads((run_dir / "run.json").read_text())
    assert (meta["state"], meta["exit_code"]) == ("stopped", 130)  # the user stopped it: not a crash
    exits = [m for m in read_messages(run_dir / "events.jsonl") if isinstance(m, protocol.Exit)]
    assert [(e.exit_code, e.signal, e.source) for e in exits] == [(130, signal.SIGINT, "agent")]
    dumps = list((run_dir / "stacks").glob("*-stack_dump-*.txt"))
    assert len(dumps) == 1 and "in hang_here" in dumps[0].read_text()

"""The job ends when the script ends: the script's non-daemon
threads are waited for and recorded, atexit handlers run and files are flushed as Python would,
and an interpreter teardown that hangs is cut off after TPUWATCH_TEARDOWN_S with the script's own
exit code (and the hung thread's stack left in the run directory)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tpuwatch import protocol
from tpuwatch_testing import SCRIPTS, child_env, read_messages

pytestmark = pytest.mark.tf


def test_hanging_teardown_is_bounded_and_keeps_the_exit_code(tmp_path):
    run_dir = tmp_path / "run"
    out = tmp_path / "unflushed.txt"
    # Without the guard the destructor holds the process for 600 s: the 120 s timeout fails the test.
    proc = subprocess.run([sys.executable, "-m", "tpuwatch.agent", "--run-dir", str(run_dir),
                           str(SCRIPTS / "teardown_hang.py"), "--code", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=120, env=child_env(TPUWATCH_TEARDOWN_S="4"))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "thread trained 5 steps" in proc.stdout and "atexit handler ran" in proc.stdout
    assert out.read_text() == "written-but-not-flushed"
    messages = read_messages(run_dir / "events.jsonl")
    steps = [m for m in messages if isinstance(m, protocol.Step)]
    exits = [m for m in messages if isinstance(m, protocol.Exit)]
    assert [s.step for s in steps] == [1, 2, 3, 4, 5]
    assert len(exits) == 1 and exits[0].exit_code == 3
    assert messages.index(exits[0]) > messages.index(steps[-1])  # the exit after the thread's steps
    # Every thread's stack as teardown hung (a C++ destructor shows as "<no Python frame>").
    stacks = (run_dir / "teardown-stacks.txt").read_text()
    assert stacks.startswith("Timeout") and "Thread 0x" in stacks, stacks


def test_a_clean_exit_is_not_delayed(tmp_path):
    run_dir = tmp_path / "run"
    script = tmp_path / "quick.py"
    script.write_text("import tensorflow as tf\nprint(float(tf.reduce_sum(tf.ones(3))))\n")
    proc = subprocess.run([sys.executable, "-m", "tpuwatch.agent", "--run-dir", str(run_dir), str(script)],
                          capture_output=True, text=True, timeout=120, env=child_env(TPUWATCH_TEARDOWN_S="30"))
    assert proc.returncode == 0 and "3.0" in proc.stdout, proc.stderr
    assert (run_dir / "teardown-stacks.txt").read_text() == ""  # the stacks timer never fired


def _tpuwatch_run(run_dir, *script_args, teardown_s: str):
    return subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(run_dir),
                           *script_args], capture_output=True, text=True, timeout=180,
                          env=child_env(TPUWATCH_TEARDOWN_S=teardown_s))


def test_a_clean_run_leaves_no_teardown_stacks_and_no_bound_line(tmp_path):
    """Every run directory held an empty teardown-stacks.txt and every run logged
    "interpreter teardown bounded at 10 s", which read as if the bound was hit."""
    script = tmp_path / "quick.py"
    script.write_text("import tensorflow as tf\nprint(float(tf.reduce_sum(tf.ones(3))))\n")
    run_dir = tmp_path / "run"
    proc = _tpuwatch_run(run_dir, str(script), teardown_s="30")
    assert proc.returncode == 0, proc.stderr
    assert not (run_dir / "teardown-stacks.txt").exists()
    assert "teardown" not in (run_dir / "events.jsonl").read_text()


def test_a_hung_teardown_is_said_once_with_its_stacks(tmp_path):
    run_dir = tmp_path / "run"
    proc = _tpuwatch_run(run_dir, str(SCRIPTS / "teardown_hang.py"), "--code", "3", "--out",
                         str(tmp_path / "out.txt"), teardown_s="4")
    assert proc.returncode == 3, proc.stderr
    assert "Thread 0x" in (run_dir / "teardown-stacks.txt").read_text()
    said = [m for m in read_messages(run_dir / "events.jsonl")
            if isinstance(m, protocol.Event) and "teardown" in m.message]
    assert len(said) == 1 and "teardown-stacks.txt" in said[0].message, said

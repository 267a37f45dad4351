"""A hung training script: the stack_dump command (answered on the server thread while the
training thread hangs) and the SIGUSR1 faulthandler dump both show the line it hangs on."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import pytest
from robust_agent import SCRIPT, start_agent

from tpuwatch import protocol
from tpuwatch.control.client import new_command

pytestmark = pytest.mark.tf

HANG_LINE = next(n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "HANG-LINE" in line)


def test_stack_dump_of_a_hung_script_shows_the_line_it_hangs_on(tmp_path):
    agent = start_agent(tmp_path, "--steps", "50", "--hang-after", "3")
    try:
        agent.wait_listening()
        agent.wait_step(3)
        time.sleep(0.5)  # well inside hang_here() now
        cmd = new_command("stack_dump")
        agent.client().send(cmd)
        result = agent.wait_for_message(lambda m: isinstance(m, protocol.Result) and m.id == cmd.id)
        assert result.ok, result.message
        dump = agent.wait_for_message(lambda m: isinstance(m, protocol.StackDump))
        path = Path(dump.path)
        assert path.parent == agent.run_dir / "stacks" and path.is_file()
        assert result.details["path"] == str(path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        text = path.read_text()
        assert text == dump.text
        # The training (main) thread comes first and its innermost frame is the hanging line.
        training = text.split('Thread "MainThread"', 1)[1].split("\nThread ", 1)[0]
        assert "TRAINING THREAD" in training.splitlines()[0]
        frames = [line for line in training.splitlines() if line.strip().startswith("File ")]
        assert frames[-1].strip() == f'File "{SCRIPT}", line {HANG_LINE}, in hang_here', frames[-3:]
        assert "HANG-LINE" in training
        # The dump came from the server thread, which is marked so nobody mistakes it for the program.
        assert "this dump" in text

        # Hangs inside C code holding the GIL get no answer: SIGUSR1 asks faulthandler instead.
        fault_file = agent.run_dir / "stacks" / "faulthandler.txt"
        os.kill(agent.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and f"line {HANG_LINE} in hang_here" not in fault_file.read_text():
            time.sleep(0.1)
        fault_text = fault_file.read_text()
        assert f'File "{SCRIPT}", line {HANG_LINE} in hang_here' in fault_text, fault_text[-2000:]
        assert agent.proc.poll() is None  # SIGUSR1 did not kill the training
    finally:
        agent.kill()

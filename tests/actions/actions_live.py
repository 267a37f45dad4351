"""A training script running under the real agent for the action tests, and the commands sent to it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tpuwatch import protocol, rundir
from tpuwatch.control.actions import Outcome, send_and_wait
from tpuwatch.control.client import new_command
from tpuwatch.monitor.recording import RecordingReader
from tpuwatch_testing import child_env, read_messages

HERE = Path(__file__).resolve().parent
TRAINER = HERE / "scripts" / "trainer.py"
RESTORE = HERE / "scripts" / "restore.py"


class LiveRun:
    """``python -m tpuwatch.agent trainer.py`` in a subprocess, trained until :meth:`stop`."""

    def __init__(self, tmp: Path, *script_args: str, env: dict | None = None) -> None:
        self.run_dir = tmp / "run"
        self.stop_file = tmp / "stop"
        cmd = [sys.executable, "-m", "tpuwatch.agent", "--run-dir", str(self.run_dir), "--sample-hz", "20",
               str(TRAINER), "--stop", str(self.stop_file), *script_args]
        self.log = open(tmp / "agent-output.txt", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=child_env(**(env or {})),
                                     cwd=tmp)
        self.output_path = tmp / "agent-output.txt"

    def wait_for_steps(self, n: int = 1, timeout: float = 120) -> None:
        reader = RecordingReader(self.run_dir / rundir.EVENTS)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(isinstance(m, protocol.Step) and m.step >= n for m in reader.read_new()):
                return
            assert self.proc.poll() is None, self.output()
            time.sleep(0.1)
        raise AssertionError(f"no step {n} in {timeout} s: {self.output()}")

    def command(self, action: str, timeout: float = 60, **args) -> Outcome:
        outcome = send_and_wait(self.run_dir, new_command(action, **args), timeout)
        assert outcome.result is not None, (action, args, outcome, self.output())
        return outcome

    def stop(self, timeout: float = 120) -> int:
        # Leaving its loop deletes the script's tf.data iterator. With autotune on, that joins the
        # pipeline's autotune thread, which sleeps for its optimization period (doubling up to
        # 60 s) and is not always woken at once, in plain runs too (docs/usage.md, "iterator
        # teardown"): a 1,441-step run here took 59.4 s to leave its `break`, and one in a loaded
        # full lane over 180 s. The trainer turns autotune off.
        self.stop_file.touch()
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.log.close()

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")[-4000:]

    def messages(self) -> list:
        return read_messages(self.run_dir / rundir.EVENTS)


def restore(paths: list[str], own: bool = False) -> list[dict]:
    """Restores each checkpoint into a fresh model in a separate TF process."""
    out = subprocess.run([sys.executable, str(RESTORE), *(["--own"] if own else []), *paths], capture_output=True,
                         text=True, timeout=180, env=child_env())
    assert out.returncode == 0, out.stderr[-4000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def weights_by_iteration(path: Path) -> dict[int, str]:
    """The trainer's --weights-log: optimizer iterations -> weights after that step (float32 hex)."""
    out = {}
    for line in path.read_text().splitlines():
        it, hexed = line.split()
        out[int(it)] = hexed
    return out

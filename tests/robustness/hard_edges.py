"""Helpers for the hard-edge tests: the tpuwatch CLI and the agent as real
subprocesses, small scripts written on the fly, bounded waits."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tpuwatch import protocol
from tpuwatch.protocol import Attach, Exit, Result
from tpuwatch_testing import child_env, read_messages

SCRIPTS = Path(__file__).resolve().parent / "scripts"

# A script that runs until STOP_FILE exists (at most 120 s), after writing READY_FILE.
WAITING_SCRIPT = """
import os, sys, time
ready, stop = sys.argv[1], sys.argv[2]
open(ready, "w").write(str(os.getpid()))
deadline = time.monotonic() + 120
while not os.path.exists(stop) and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def tpuwatch(*args: str, env: dict | None = None, timeout: float = 180, cwd: Path | None = None,
             input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpuwatch", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=child_env(**(env or {})), input=input)


def write_script(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body))
    return path


def one_line_error(proc: subprocess.CompletedProcess, *words: str, code: int = 2) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tpuwatch: "), lines[0]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout} s")


def meta(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}


def exits(run_dir: Path) -> list[Exit]:
    return [m for m in read_messages(run_dir / "events.jsonl") if isinstance(m, Exit)]


def results(run_dir: Path) -> list[Result]:
    return [m for m in read_messages(run_dir / "events.jsonl") if isinstance(m, Result)]


class WaitingAgent:
    """``python -m tpuwatch.agent [--listen ...] WAITING_SCRIPT`` in the background."""

    def __init__(self, tmp_path: Path, run_dir: Path, *agent_args: str, env: dict | None = None,
                 name: str = "w", cwd: Path | None = None) -> None:
        self.run_dir = run_dir
        self.ready = tmp_path / f"{name}.ready"
        self.stop_file = tmp_path / f"{name}.stop"
        script = write_script(tmp_path / f"{name}_wait.py", WAITING_SCRIPT)
        self.log = tmp_path / f"{name}.out"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tpuwatch.agent", "--run-dir", str(run_dir), *agent_args, str(script),
                 str(self.ready), str(self.stop_file)],
                stdout=out, stderr=subprocess.STDOUT, env=child_env(**(env or {})), cwd=cwd or tmp_path,
                start_new_session=True)

    def wait_ready(self) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the agent ended early ({self.proc.returncode}): {self.output()}")
            sock = meta(self.run_dir).get("socket")
            return self.ready.exists() and bool(sock) and Path(sock).exists()
        wait_for(up, 120, "the agent's socket and the script")

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def finish(self) -> int:
        self.stop_file.write_text("")
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def attach_line(token: str = "", offset: int = -1) -> bytes:
    return protocol.encode(Attach(protocol_version=protocol.PROTOCOL_VERSION, offset=offset, token=token))


def connect_unix(path: str | Path, timeout: float = 10.0) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(str(path))
    return s


def tmpfs(mount_point: Path, size: str = "5m") -> None:
    """Mounts a small tmpfs (root only). Raises CalledProcessError with the reason otherwise."""
    mount_point.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], check=True,
                   capture_output=True)


def umount(mount_point: Path) -> None:
    subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def env_without_home() -> dict:
    env = dict(os.environ)
    env.pop("TPUWATCH_RUN_DIR", None)
    env.pop("TPUWATCH_RUN_ID", None)
    return env

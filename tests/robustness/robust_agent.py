"""A real agent in a background subprocess, for tests that talk to its socket while it trains."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tpuwatch import address, protocol
from tpuwatch.control.client import AgentClient
from tpuwatch_testing import child_env, read_messages

SCRIPT = Path(__file__).resolve().parent / "scripts" / "robust_train.py"


@dataclass
class LiveAgent:
    proc: subprocess.Popen
    run_dir: Path
    ready: Path

    @property
    def meta(self) -> dict:
        try:
            return json.loads((self.run_dir / "run.json").read_text())
        except (OSError, ValueError):
            return {}

    def wait_listening(self, timeout: float = 90.0) -> None:
        """Waits until the socket is up (and the TCP address recorded, if any)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            meta = self.meta
            if meta.get("socket") and Path(meta["socket"]).exists():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"the agent ended early ({self.proc.returncode}):\n{self.output()}")
            time.sleep(0.1)
        raise AssertionError(f"no agent socket after {timeout} s:\n{self.output()}")

    def wait_step(self, step: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if int(self.ready.read_text() or 0) >= step:
                    return
            except (OSError, ValueError):
                pass
            if self.proc.poll() is not None:
                raise AssertionError(f"the agent ended early ({self.proc.returncode}):\n{self.output()}")
            time.sleep(0.05)
        raise AssertionError(f"step {step} not reached in {timeout} s:\n{self.output()}")

    @property
    def tcp(self) -> tuple[str, int]:
        return address.parse(self.meta["tcp"])

    @property
    def token(self) -> str:
        return (self.run_dir / "token").read_text().strip()

    def client(self) -> AgentClient:
        return AgentClient.for_run(self.run_dir)

    def wait(self, timeout: float = 180.0) -> int:
        return self.proc.wait(timeout=timeout)

    def output(self) -> str:
        try:
            return (self.run_dir.parent / f"{self.run_dir.name}.out").read_text()[-4000:]
        except OSError:
            return ""

    def messages(self) -> list:
        return read_messages(self.run_dir / "events.jsonl")

    def wait_for_message(self, predicate, timeout: float = 30.0):
        """The first recorded message matching ``predicate`` (polls the recording)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dec = protocol.Decoder()
            try:
                with open(self.run_dir / "events.jsonl", "rb") as f:
                    for line in f:
                        if line.endswith(b"\n"):
                            m = dec.decode(line)
                            if m is not None and predicate(m):
                                return m
            except FileNotFoundError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"no matching message in {timeout} s:\n{self.output()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def start_agent(tmp_path: Path, *script_args: str, listen: str = "", env: dict | None = None,
                name: str = "run") -> LiveAgent:
    run_dir = tmp_path / name
    ready = tmp_path / f"{name}.ready"
    cmd = [sys.executable, "-m", "tpuwatch.agent", "--run-dir", str(run_dir)]
    if listen:
        cmd += ["--listen", listen]
    cmd += [str(SCRIPT), "--ready", str(ready), *script_args]
    out = open(tmp_path / f"{name}.out", "wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(**(env or {})), cwd=tmp_path,
                            start_new_session=True)
    out.close()
    return LiveAgent(proc, run_dir, ready)

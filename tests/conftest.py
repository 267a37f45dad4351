"""Shared fixtures: isolated TPUWATCH_HOME, and running real scripts under the real agent."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tpuwatch import protocol

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_runs"
SCRIPTS = Path(__file__).resolve().parent / "agent" / "scripts"


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("tpuwatch-home")
    monkeypatch.setenv("TPUWATCH_HOME", str(home))
    monkeypatch.delenv("TPUWATCH_RUN_DIR", raising=False)
    monkeypatch.delenv("TPUWATCH_RUN_ID", raising=False)
    return home


@dataclass
class AgentRun:
    returncode: int
    output: str
    run_dir: Path
    messages: list

    def of(self, cls):
        return [m for m in self.messages if isinstance(m, cls)]

    @property
    def steps(self) -> list:
        return self.of(protocol.Step)

    @property
    def warnings(self) -> list:
        return [m for m in self.of(protocol.Event) if m.level in ("warning", "error")]


def read_messages(path: Path) -> list:
    decoder = protocol.Decoder()
    out = []
    with open(path, "rb") as f:
        for line in f:
            msg = decoder.decode(line)
            if msg is not None:
                out.append(msg)
    assert decoder.malformed == 0, decoder.last_error
    return out


def child_env(**extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


@pytest.fixture
def run_agent(tmp_path):
    """Runs ``python -m tpuwatch.agent SCRIPT ARGS`` as a real subprocess; returns an AgentRun."""

    def run(script: Path | str, *args: str, timeout: float = 180, env: dict | None = None, agent_args=()) -> AgentRun:
        run_dir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        cmd = [sys.executable, "-m", "tpuwatch.agent", "--run-dir", str(run_dir), *agent_args, str(script), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env(**(env or {})), cwd=tmp_path)
        events = run_dir / "events.jsonl"
        messages = read_messages(events) if events.exists() else []
        return AgentRun(proc.returncode, proc.stdout + proc.stderr, run_dir, messages)

    return run

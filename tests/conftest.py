"""Shared fixtures: isolated TPUWATCH_HOME, and running real scripts under the real agent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tpuwatch_testing import AgentRun, child_env, read_messages


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("tpuwatch-home")
    monkeypatch.setenv("TPUWATCH_HOME", str(home))
    monkeypatch.delenv("TPUWATCH_RUN_DIR", raising=False)
    monkeypatch.delenv("TPUWATCH_RUN_ID", raising=False)
    return home


@pytest.fixture
def run_agent(tmp_path):
    """Runs ``python -m tpuwatch.agent SCRIPT ARGS`` as a real subprocess; returns an AgentRun."""

    def run(script: Path | str, *args: str, timeout: float = 180, env: dict | None = None, agent_args=()) -> AgentRun:
        run_dir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        cmd = [sys.executable, "-m", "tpuwatch.agent", "--run-dir", str(run_dir), *agent_args, str(script), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env(**(env or {})),
                              cwd=tmp_path)
        events = run_dir / "events.jsonl"
        messages = read_messages(events) if events.exists() else []
        return AgentRun(proc.returncode, proc.stdout + proc.stderr, run_dir, messages)

    return run

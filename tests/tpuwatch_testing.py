"""Shared test helpers (importable from any test folder: ``tests`` is on pytest's pythonpath)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tpuwatch import protocol

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_runs"
SCRIPTS = Path(__file__).resolve().parent / "agent" / "scripts"


def pending_agent(run_dir: Path):
    """An in-process agent (no TensorFlow needed) with a command always queued, which records the
    global step at each safe point it is given in ``agent.safe_points``."""
    from tpuwatch.agent.runtime import Agent

    class PendingAgent(Agent):
        safe_points: list[int]

        @property
        def has_pending(self) -> bool:
            return True

        def safe_point(self) -> None:
            self.safe_points.append(self.global_step)

    agent = PendingAgent(run_dir, "t")
    agent.safe_points = []
    return agent



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


class RecordingAgent:
    """What the agent's transport ``Server`` needs from an agent: its recording
    (``run_dir/events.jsonl``) and somewhere for events; commands are dropped."""

    def __init__(self, run_dir: Path) -> None:
        self.events_path = run_dir / "events.jsonl"
        self.events: list[str] = []

    def event(self, level: str, source: str, message: str) -> None:
        self.events.append(message)

    def submit(self, command) -> None:
        pass


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
    # No empty entry: an empty PYTHONPATH item is the working directory, which plain Python does
    # not put on a script's sys.path (CI runs without a PYTHONPATH of its own).
    entries = [e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e]
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *[e for e in entries if e != str(ROOT)]])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Read every step's loss, so tests can compare each one with the script's (the default reads
    # at most every 10 ms of training; tests/corpus checks that too).
    env.setdefault("TPUWATCH_LOSS_EVERY_S", "0")
    env.update(extra)
    return env


def run_and_report(tmp_path: Path, script: Path, *args: str, name: str = "run", options: tuple[str, ...] = ()) -> dict:
    """``tpuwatch run --headless`` of ``script`` into ``tmp_path / name``, then ``tpuwatch report
    --format json`` of it, with the recording's messages as ``_events``; ``options``: tpuwatch
    run's own, before the script."""
    run_dir = tmp_path / name
    env = child_env(TPUWATCH_HOME=str(tmp_path / "home"))
    run = subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(run_dir),
                          *options, str(script), *args], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = subprocess.run([sys.executable, "-m", "tpuwatch", "report", str(run_dir), "--format", "json"],
                            capture_output=True, text=True, timeout=120, env=env, check=True)
    data = json.loads(report.stdout)
    data["_events"] = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return data

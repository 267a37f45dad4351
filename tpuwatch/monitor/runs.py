"""The runs under ``$TPUWATCH_HOME/runs`` and whether each is running, finished, stopped,
crashed or lost: the one place that decides a run's liveness (a process alive by its pid in
run.json, an exit record, an exit code the launcher wrote). ``ls``, ``report``, the group source
and stopping a run all ask here.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuwatch import protocol, rundir
from tpuwatch.monitor.group import WorkerDir, worker_dirs
from tpuwatch.monitor.recording import tail_messages
from tpuwatch.protocol import Exit, Hello, Step

#: Exit codes of a process ended by the signals a stop sends (SIGINT, SIGTERM, SIGKILL).
STOP_CODES = (128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGKILL)


def pid_alive(pid: object) -> bool:
    """Whether a process with this pid exists (and is not a zombie we could see)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:  # a zombie is gone for our purposes; /proc tells on Linux
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b") ", 1)[-1][:1] != b"Z"
    except OSError:
        return True


def run_alive(meta: dict[str, Any]) -> bool:
    """Whether the training process a run.json names (``child_pid``) still runs."""
    return pid_alive(meta.get("child_pid"))


def ended_state(exit_code: int, stop_requested: bool) -> str:
    """The word ``ls`` shows for an ended run. An interrupt (SIGINT, exit 130) is always someone
    stopping the run (Ctrl-C, or a viewer); SIGTERM/SIGKILL only when a stop was requested."""
    if exit_code == 0:
        return "finished"
    if exit_code == STOP_CODES[0] or (stop_requested and exit_code in STOP_CODES):
        return "stopped"
    return "crashed"


@dataclass(frozen=True)
class RunInfo:
    """One line of ``tpuwatch ls``."""

    id: str
    path: Path
    script: str
    state: str  # running | finished | stopped | crashed | lost | unknown
    start: float | None
    steps: int | None  # last recorded global step
    exit_code: int | None
    end: float | None = None
    last_t: float | None = None  # newest message time in the recording's tail


def _first_hello(path: Path) -> Hello | None:
    try:
        with open(path, "rb") as f:
            line = f.readline(protocol.MAX_LINE_BYTES)
    except OSError:
        return None
    m = protocol.Decoder().decode(line) if line.endswith(b"\n") else None
    return m if isinstance(m, Hello) else None


def run_info(run_dir: Path) -> RunInfo:
    """What ``ls`` shows for one run directory, reading run.json and the recording's ends."""
    workers = worker_dirs(run_dir)
    if workers is not None:
        return _group_info(run_dir, workers)
    meta = rundir.read_meta(run_dir)
    events = run_dir / rundir.EVENTS
    tail = tail_messages(events)
    hello = _first_hello(events)
    last_step = next((m for m in reversed(tail) if isinstance(m, Step)), None)
    exit_msg = next((m for m in reversed(tail) if isinstance(m, Exit)), None)
    last_t = next((m.t for m in reversed(tail) if hasattr(m, "t")), None)
    exit_code = exit_msg.exit_code if exit_msg else meta.get("exit_code")
    stop_requested = bool(meta.get("stop_requested"))
    if exit_msg is not None:
        state = ended_state(exit_msg.exit_code, stop_requested)
    elif run_alive(meta):
        state = "running"
    elif isinstance(meta.get("exit_code"), int):
        state = ended_state(meta["exit_code"], stop_requested)
    elif meta or hello:
        state = "lost"
    else:
        state = "unknown"
    start = meta.get("started") if isinstance(meta.get("started"), (int, float)) else (
        hello.t if hello else None)
    return RunInfo(
        id=str(meta.get("run_id") or (hello.run_id if hello else "") or run_dir.name),
        path=run_dir,
        script=str(meta.get("script") or (hello.script if hello else "")),
        state=state,
        start=start,
        steps=last_step.step if last_step else None,
        exit_code=exit_code if isinstance(exit_code, int) else None,
        end=exit_msg.t if exit_msg else (meta.get("ended") if isinstance(meta.get("ended"),
                                                                         (int, float)) else None),
        last_t=last_t,
    )


def _group_info(run_dir: Path, workers: list[WorkerDir]) -> RunInfo:
    """A group is running while any worker runs; it ended as its launcher recorded (the first
    non-zero worker exit code), else as its workers did."""
    meta = rundir.read_meta(run_dir)
    infos = [run_info(w.path) for w in workers]
    states = [i.state for i in infos]
    code = meta.get("exit_code")
    if "running" in states:
        state = "running"
    elif isinstance(code, int):
        state = ended_state(code, bool(meta.get("stop_requested")) or "stopped" in states)
    else:
        state = next((s for s in ("crashed", "lost", "unknown", "stopped") if s in states), "finished")
        code = next((i.exit_code for i in infos if i.exit_code), None)
    steps = [i.steps for i in infos if i.steps is not None]
    ends = [i.end for i in infos if i.end is not None]
    lasts = [i.last_t for i in infos if i.last_t is not None]
    return RunInfo(
        id=str(meta.get("run_id") or run_dir.name), path=run_dir,
        script=f"{meta.get('script', '')} ({len(workers)} workers)", state=state,
        start=meta.get("started") if isinstance(meta.get("started"), (int, float)) else None,
        steps=max(steps) if steps else None, exit_code=code if isinstance(code, int) else None,
        end=max(ends) if ends and state != "running" else None, last_t=max(lasts) if lasts else None)


def list_runs(root: str | Path | None = None) -> list[RunInfo]:
    """Runs under ``root`` (default ``$TPUWATCH_HOME/runs``), newest first. A missing root is an
    empty list."""
    root = Path(root) if root is not None else rundir.runs_root()
    try:
        dirs = [d for d in root.iterdir() if d.is_dir()]
    except FileNotFoundError:
        return []
    runs = [run_info(d) for d in dirs if rundir.is_run_dir(d)]
    runs.sort(key=lambda r: (r.start or 0.0, r.id), reverse=True)
    return runs

"""The runs under ``$TPUWATCH_HOME/runs`` and whether each is running, finished, stopped,
crashed or lost: the one place that decides a run's liveness (the process run.json names, by
its pid *and* the identity recorded at launch, so that a reused pid is not the run; an exit
record; an exit code the launcher wrote), and that signals a run's process (:class:`Process`).
``ls``, ``report``, ``attach``, the group source, the launcher and stopping a run all ask here.
"""

from __future__ import annotations

import math
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuwatch import rundir
from tpuwatch.monitor.group import WorkerDir, worker_dirs
from tpuwatch.monitor.recording import first_message, last_step, tail_messages
from tpuwatch.protocol import Exit, Hello, Step

#: Exit codes of a process ended by the signals a stop sends (SIGINT, SIGTERM, SIGKILL).
STOP_CODES = (128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGKILL)


#: run.json written before process identities were recorded: a process that started more than
#: this long after the run did is not its training process (its pid was reused).
_LEGACY_START_SLACK_S = 10.0


@dataclass(frozen=True)
class Process:
    """A training process as run.json names it: ``pid``, process group ``pgid`` (the pid, as the
    launcher starts it in its own session), and ``identity`` (:func:`rundir.process_identity`,
    recorded at launch). Every "alive" verdict and every signal to a run's process goes through
    here, and a pid now held by another process (reused after the run's died) is neither.

    Without a recorded identity (a run.json from before identities were recorded) the process's
    start time must not be later than the run's ``started``; without /proc (not Linux), the pid
    alone decides, as it did before."""

    pid: int
    pgid: int | None = None
    identity: str | None = None
    started: float | None = None

    def is_ours(self) -> bool:
        """Whether ``pid`` is still this process and it has not ended (a zombie has)."""
        now = rundir.process_identity(self.pid)
        if now is None:
            return _pid_exists(self.pid) and not os.path.isdir("/proc/self")  # no /proc: the pid decides
        return self._same(now) and rundir.process_state(self.pid) != "Z"

    def _same(self, identity: str) -> bool:
        if self.identity:
            return identity == self.identity
        return self.started is None or _started_by(identity, self.started + _LEGACY_START_SLACK_S)

    def alive(self) -> bool:
        """Whether the process runs (:meth:`is_ours`)."""
        return self.is_ours()

    def group_alive(self) -> bool:
        """Whether its process group has a member: the process itself, or (after it ended) the
        children it left in the group. A group id cannot be reused while a member holds it, so
        a group whose leader's pid now names another process is not ours."""
        if self.pgid is None:
            return self.alive()
        if self.pgid == self.pid:
            now = rundir.process_identity(self.pid)
            if now is not None and not self._same(now):
                return False  # the pid (and so the group id) now belongs to another process
        elif not self.alive() or _pgid(self.pid) != self.pgid:
            return False  # a group it does not lead is its only while it is in it
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return False  # another user's group: never ours
        return True

    def signal(self, sig: int) -> bool:
        """Sends ``sig`` to the process group (or the process) if it is still this run's (checked
        right before). Returns whether it went out."""
        try:
            if self.pgid is not None:
                if not self.group_alive():
                    return False
                os.killpg(self.pgid, sig)
            else:
                if not self.is_ours():
                    return False
                os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True


def process_of(meta: dict[str, Any]) -> Process | None:
    """The training process a run.json names (``child_pid``, ``pgid``, ``child_identity``), or None."""
    pid = meta.get("child_pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    pgid = meta.get("pgid")
    identity = meta.get("child_identity")
    started = meta.get("started")
    return Process(pid=pid, pgid=pgid if isinstance(pgid, int) and not isinstance(pgid, bool) and pgid > 0 else None,
                   identity=identity if isinstance(identity, str) and identity else None,
                   started=float(started) if isinstance(started, (int, float)) and not isinstance(started, bool)
                   and math.isfinite(started) else None)


def run_alive(meta: dict[str, Any]) -> bool:
    """Whether the training process a run.json names still runs (:class:`Process`)."""
    process = process_of(meta)
    return process is not None and process.alive()


def run_dir_alive(run_dir: Path) -> bool:
    """Whether the run recorded in ``run_dir`` still runs: its training process, or for a
    group (``run --workers``) any worker's."""
    workers = worker_dirs(run_dir)
    dirs = [w.path for w in workers] if workers is not None else [run_dir]
    return any(run_alive(rundir.read_meta(d)) for d in dirs)


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _started_by(identity: str, latest: float) -> bool:
    """Whether the process of ``identity`` started no later than ``latest`` (epoch seconds)."""
    try:
        ticks = int(identity.rpartition(":")[2])
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK") <= latest
    except (OSError, ValueError, StopIteration):
        return True  # cannot tell: as before, the pid decides


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
    problem: str = ""  # why its run.json or recording cannot be read (one line), "" when they can


def run_info(run_dir: Path) -> RunInfo:
    """What ``ls`` shows for one run directory, reading run.json and the recording's ends."""
    workers = worker_dirs(run_dir)
    if workers is not None:
        return _group_info(run_dir, workers)
    meta = rundir.read_meta(run_dir)
    events = run_dir / rundir.EVENTS
    problem = rundir.files_problem(run_dir)
    tail = tail_messages(events)
    first = first_message(events)
    hello = first if isinstance(first, Hello) else None
    # The tail is enough unless evaluation or predict went on for long after the last step.
    newest_step = next((m for m in reversed(tail) if isinstance(m, Step)), None) or last_step(events)
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
        steps=newest_step.step if newest_step else None,
        exit_code=exit_code if isinstance(exit_code, int) else None,
        end=exit_msg.t if exit_msg else (meta.get("ended") if isinstance(meta.get("ended"),
                                                                         (int, float)) else None),
        last_t=last_t,
        problem=problem,
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


def latest_live(root: str | Path | None = None) -> Path | None:
    """The newest running run under ``root`` (what ``attach`` and ``profile``/``checkpoint``
    without RUN go to: not a newer run that has ended), None when none runs."""
    return next((r.path for r in list_runs(root) if r.state == "running"), None)

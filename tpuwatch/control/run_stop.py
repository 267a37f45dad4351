"""Stopping a run on purpose, from any viewer on the training host, and telling it apart.

``tpuwatch run`` stops its own child (:func:`tpuwatch.control.launcher.stop`); a ``tpuwatch
attach`` viewer is not the child's parent, so it signals the process group named in run.json and
watches the process disappear instead of waiting for it. Either way the stop request is recorded
first (run.json ``stop_requested`` and an ``Event`` in the recording), so that ``ls``, ``report``,
``replay`` and every dashboard say the run was **stopped** by the user, not that it crashed.
"""

from __future__ import annotations

import os
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from tpuwatch import protocol, rundir
from tpuwatch.monitor.recording import append, last_exit
from tpuwatch.monitor.runs import Process, ended_state, process_of

#: How often the liveness of a process that is not our child is checked while waiting (s).
POLL_S = 0.1


class StopError(Exception):
    """The run cannot be stopped from here: one line saying why and what to do."""


def record_stop_request(run_dir: Path, by: str, clock: Callable[[], float] = time.time) -> None:
    """Notes in run.json and in the recording that the user asked to stop. Best effort: a stop
    must go ahead even when the run directory cannot be written."""
    t = clock()
    try:
        rundir.update_meta(run_dir, stop_requested=t, stopped_by=by)
    except OSError:
        pass  # the signal still goes out; the run is then listed by its exit code alone
    try:
        append(run_dir / rundir.EVENTS, [protocol.Event(t=t, level="warning", source=protocol.STOP_SOURCE,
                                                        message=f"stop requested from {by}",
                                                        fact=protocol.EventFact.STOP_REQUESTED, subject=by)])
    except OSError:
        pass  # as above: never let bookkeeping block the stop


@dataclass(frozen=True)
class Target:
    """One training process to stop: its run directory and the process run.json names."""

    run_dir: Path
    process: Process

    def signal(self, sig: int) -> None:
        self.process.signal(sig)  # nothing goes out once its pid names another process

    def alive(self) -> bool:
        return self.process.alive() and not _exit_recorded(self.run_dir)


def target_of(run_dir: Path) -> Target:
    """The process behind ``run_dir``; raises :class:`StopError` when it is not on this host,
    not running, or not shown to be the run's (:func:`check_owned`, an identity, its group)."""
    check_owned(run_dir)
    meta = rundir.read_meta(run_dir)
    host = meta.get("host")
    if isinstance(host, str) and host and host != rundir.hostname():
        raise StopError(f"the run trains on {host}, not here: stop it there "
                        f"(`tpuwatch attach` on {host}, or attach with --listen and its token)")
    process = process_of(meta)
    if process is None:
        raise StopError(f"{run_dir}/run.json names no training process; stop it where it was started")
    if process.identity is None and os.path.isdir("/proc/self"):
        raise StopError(f"{run_dir}/run.json gives process {process.pid} but no identity of it (child_identity), "
                        "so it cannot be told from any other process: stop the run where it was started")
    if not process.alive() or _exit_recorded(run_dir):
        raise StopError("the training process has already ended")
    if process.pgid is not None and not process.group_alive():
        raise StopError(f"{run_dir}/run.json gives process group {process.pgid}, which is not the group of "
                        f"process {process.pid}: stop the run where it was started")
    return Target(run_dir=run_dir, process=process)


def check_owned(run_dir: Path) -> None:
    """Only a run directory and a run.json of this user's, that nobody else can write, may name a
    process to signal: another user could otherwise name any process of ours in one. Raises
    :class:`StopError` (one line) for any other."""
    for path in (run_dir, run_dir / rundir.META):
        try:
            sts = [os.lstat(path), os.stat(path)]  # a link, and what it points at
        except OSError as e:
            raise StopError(f"cannot read {path} ({e.strerror or e}): stop the run where it was started") from None
        for st in sts:
            if st.st_uid != os.getuid():
                raise StopError(f"{path} belongs to another user (uid {st.st_uid}): tpuwatch stops only runs "
                                "whose directory and run.json are yours")
            if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o022:
                raise StopError(f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}), so anyone "
                                f"could have named the process to stop: `chmod go-w {path}`, then stop again")


def stop_runs(
    run_dirs: Sequence[Path],
    *,
    by: str,
    grace_int_s: float = 15.0,
    grace_term_s: float = 10.0,
    report: Callable[[str], None] = lambda line: None,
    clock: Callable[[], float] = time.time,
) -> int:
    """Stops the training processes of ``run_dirs`` (one run, or every worker of a group) that
    this process did not start: SIGINT, then SIGTERM, then SIGKILL, each after its grace period.
    Records the request and, for a process killed before it could, its exit. Returns the exit
    code (the first non-zero one of several workers). Raises :class:`StopError`."""
    targets = [target_of(d) for d in run_dirs]
    for t in targets:
        record_stop_request(t.run_dir, by, clock)
    what = "the training process group" if len(targets) == 1 else f"{len(targets)} workers"
    sent: dict[Path, int] = {}
    for sig, grace in ((signal.SIGINT, grace_int_s), (signal.SIGTERM, grace_term_s), (signal.SIGKILL, 10.0)):
        living = [t for t in targets if t.alive()]
        if not living:
            break
        report(f"sending {sig.name} to {what}; waiting up to {grace:.0f} s")
        for t in living:
            t.signal(sig)
            sent[t.run_dir] = sig
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(t.alive() for t in living):
            time.sleep(POLL_S)
    codes = [_finish(t, sent.get(t.run_dir, signal.SIGINT), clock) for t in targets]
    return next((c for c in codes if c != 0), codes[0] if codes else 0)


def _finish(target: Target, last_signal: int, clock: Callable[[], float]) -> int:
    """Records the end of a stopped process that left no exit record; returns its exit code."""
    run_dir = target.run_dir
    exit_msg = last_exit(run_dir / rundir.EVENTS)
    if exit_msg is None:
        # Our signal killed it before its agent could write (SIGKILL) or the process is stuck
        # past every grace period: record what we know, as the launcher would.
        name = signal.Signals(last_signal).name
        alive = target.process.alive()
        code = 128 + last_signal
        reason = (f"killed by {name} (stopped by the user)" if not alive
                  else f"still running after {name} (stopped by the user)")
        try:
            append(run_dir / rundir.EVENTS, [protocol.Exit(t=clock(), exit_code=code, signal=last_signal,
                                                           source="launcher", reason=reason)])
        except OSError:
            pass
    else:
        code = exit_msg.exit_code
    meta = rundir.read_meta(run_dir)
    if not isinstance(meta.get("exit_code"), int):  # the launcher (if still there) records it too
        try:
            rundir.update_meta(run_dir, state=ended_state(code, True), exit_code=code, ended=clock())
        except OSError:
            pass
    return code


def _exit_recorded(run_dir: Path) -> bool:
    return last_exit(run_dir / rundir.EVENTS) is not None

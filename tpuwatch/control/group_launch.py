"""``tpuwatch run --workers N``: N MultiWorkerMirroredStrategy workers on this machine, each under
its own agent, supervised as one process group.

Each worker gets ``TF_CONFIG`` with the whole cluster (free localhost ports) and its own task
index, and its own run directory inside the group directory (layout: :mod:`tpuwatch.monitor.group`).

Why a supervisor: when one worker of a synchronous job dies, the others block in the next
collective (all-reduce) and never notice. The supervisor records the dead worker's end at once
(its exit record with the exit code or signal), waits ``grace_s`` for the others to end by
themselves, then stops them (SIGINT, SIGTERM, SIGKILL, as :func:`launcher.stop`) and records each
one's end. The group's exit code is the first non-zero worker exit code (128+N for signal N).
A worker that ends cleanly starts no countdown: the others may legitimately run a little longer.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tpuwatch import address, rundir, settings
from tpuwatch.control import launcher
from tpuwatch.control.launcher import Launch, LaunchError
from tpuwatch.monitor.group import worker_dir_name, worker_name

#: Seconds the other workers get to end by themselves after one died (``--worker-grace``).
DEFAULT_GRACE_S = 15.0
#: Most workers ``--workers`` accepts on one machine (each is a whole TF process).
MAX_WORKERS = 16


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free TCP ports (bound together, then released for the workers to take)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tf_config(ports: list[int], index: int) -> str:
    return json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


def _worker_listen(listen: str, index: int) -> str:
    """``HOST:PORT`` for worker ``index``: the given port plus the index (one listener each)."""
    if not listen:
        return ""
    try:
        _, port = address.parse(listen, listen=True)
    except ValueError:
        return listen  # the agent reports a malformed address itself
    return f"{listen.strip().rpartition(':')[0]}:{port + index}" if port else listen


@dataclass(frozen=True)
class WorkerEnd:
    name: str
    exit_code: int
    t: float
    stopped: bool  # the supervisor (or the user) stopped it, it did not end by itself


@dataclass
class GroupLaunch:
    """A started group. ``workers[i]`` is worker i's :class:`Launch`."""

    run_dir: Path
    run_id: str
    workers: list[Launch]
    names: list[str]
    started: float
    grace_s: float = DEFAULT_GRACE_S
    ends: dict[str, WorkerEnd] = field(default_factory=dict)
    # re-entrant: a second Ctrl-C's handler may run on the main thread inside mark_stopping
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _stopping: set[str] = field(default_factory=set, repr=False)

    @property
    def pid(self) -> int:
        return self.workers[0].pid

    def alive(self) -> bool:
        return any(w.alive() for w in self.workers)

    def first_failure(self) -> WorkerEnd | None:
        bad = [e for e in self.ends.values() if e.exit_code != 0]
        return min(bad, key=lambda e: e.t) if bad else None

    def exit_code(self) -> int:
        """The first non-zero worker exit code (by time), else 0."""
        bad = self.first_failure()
        return bad.exit_code if bad else 0

    def mark_stopping(self, name: str) -> None:
        """The user is stopping this worker (Ctrl-C): its non-zero end starts no countdown."""
        with self._lock:
            self._stopping.add(name)

    def was_stopped(self, name: str) -> bool:
        """The user or the supervisor asked this worker to stop (its end is not a failure cause)."""
        return name in self._stopping

    def finish_worker(self, index: int, clock: Callable[[], float] = time.time) -> int:
        """Waits for worker ``index`` and records its end once (exit record, its run.json, the
        group's run.json). Returns its shell exit code."""
        launch, name = self.workers[index], self.names[index]
        launch.proc.wait()
        with self._lock:
            end = self.ends.get(name)
            if end is None:
                code = launcher.finish(launch, clock)
                end = self.ends[name] = WorkerEnd(name, code, clock(), name in self._stopping)
                self._write_meta(clock)
            return end.exit_code

    def _write_meta(self, clock: Callable[[], float]) -> None:
        meta = rundir.read_meta(self.run_dir)
        entries = meta.get("workers")
        for e in entries if isinstance(entries, list) else []:
            end = self.ends.get(str(e.get("name"))) if isinstance(e, dict) else None
            if end is not None:
                e.update(state="finished" if end.exit_code == 0 else "crashed", exit_code=end.exit_code,
                         ended=end.t, stopped=end.stopped)
        meta["workers"] = entries
        if len(self.ends) == len(self.workers):
            code = self.exit_code()
            meta.update(state="finished" if code == 0 else "crashed", exit_code=code, ended=clock())
        try:
            rundir.write_meta(self.run_dir, meta)
        except OSError:
            pass  # a full disk: each worker's own run.json (written with its reserve) still says it

    def stop(self, names: list[str] | None = None, grace_int_s: float = 15.0, grace_term_s: float = 10.0,
             report: Callable[[str], None] = lambda line: None) -> int:
        """Stops the named workers (default: all) at once, in parallel; records each one's end.
        Returns the group's exit code so far."""
        targets = [i for i, n in enumerate(self.names) if names is None or n in names]
        with self._lock:
            self._stopping.update(self.names[i] for i in targets if self.workers[i].alive())

        def one(i: int) -> None:
            launcher.terminate(self.workers[i], grace_int_s, grace_term_s,
                               report=lambda line, n=self.names[i]: report(f"{n}: {line}"))  # type: ignore[misc]
            self.finish_worker(i)

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in targets]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return self.exit_code()


def start_group(
    script: str,
    args: list[str],
    workers: int,
    *,
    module: bool = False,
    run_dir: Path | None = None,
    python: str | None = None,
    listen: str = "",
    sample_hz: float | None = None,
    env: dict[str, str] | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    clock: Callable[[], float] = time.time,
) -> GroupLaunch:
    """Creates the group directory and starts ``workers`` agents with the script."""
    if not 1 <= workers <= MAX_WORKERS:
        raise LaunchError(f"--workers {workers}: give 1 to {MAX_WORKERS} workers")
    if grace_s < 0:
        raise LaunchError(f"--worker-grace {grace_s}: must be 0 or more seconds")
    launcher.check_script(script, module)
    exe = launcher.check_python(python or sys.executable)
    if module:
        launcher.check_module(script, exe, env)
    run_id = run_dir.name if run_dir else rundir.new_run_id(script, clock)
    run_dir = run_dir or rundir.runs_root() / run_id
    try:
        rundir.create(run_dir, run_id, new=True)
    except rundir.RunDirError as e:
        raise LaunchError(f"run directory: {e.strerror}") from None
    except OSError as e:
        raise LaunchError(f"run directory {run_dir} is not writable ({e.strerror}); "
                          "set TPUWATCH_HOME or pass --run-dir") from None
    rundir.release_reserve(run_dir)  # the workers' directories hold the reserves that matter
    names = [worker_name(i) for i in range(workers)]
    started = clock()
    rundir.write_meta(run_dir, {
        "run_id": run_id, "group": True, "script": script, "argv": [script, *args], "python": exe,
        "cwd": os.getcwd(), "host": rundir.hostname(), "started": started, "launcher_pid": os.getpid(),
        "state": "running", "grace_s": grace_s,
        "workers": [{"name": names[i], "index": i, "dir": worker_dir_name(i), "state": "running"}
                    for i in range(workers)],
    })
    ports = free_ports(workers)
    base_env = dict(os.environ if env is None else env)
    if listen:
        # One token for every worker, so `tpuwatch attach H1:P1 H2:P2 --token-file F` opens them all.
        base_env.setdefault(settings.TOKEN.name, rundir.write_token(run_dir))
    launches: list[Launch] = []
    try:
        for i in range(workers):
            child_env = dict(base_env)
            child_env["TF_CONFIG"] = tf_config(ports, i)
            launches.append(launcher.start(
                script, args, module=module, run_dir=run_dir / worker_dir_name(i), python=exe,
                listen=_worker_listen(listen, i), sample_hz=sample_hz, env=child_env, clock=clock,
                run_id=f"{run_id}-{worker_dir_name(i)}",
                extra_meta={"group_run_id": run_id, "worker": names[i], "worker_index": i}))
    except LaunchError:
        for launch in launches:
            launcher.stop(launch, grace_int_s=2.0, grace_term_s=2.0)
        raise
    meta = rundir.read_meta(run_dir)
    for entry, launch in zip(meta["workers"], launches):
        entry["child_pid"] = launch.pid
    rundir.write_meta(run_dir, meta)
    return GroupLaunch(run_dir=run_dir, run_id=run_id, workers=launches, names=names, started=started,
                       grace_s=grace_s)


class Supervisor:
    """Watches a group from a background thread: records each worker's end as it happens and,
    ``grace_s`` after the first failure, stops the workers still running. ``say`` gets one-line
    status messages (the launcher prints them on stderr)."""

    def __init__(self, group: GroupLaunch, *, say: Callable[[str], None] = lambda line: None,
                 poll_s: float = 0.1, clock: Callable[[], float] = time.time) -> None:
        self.group = group
        self._say = say
        self._poll_s = poll_s
        self._clock = clock
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tpuwatch-group-supervisor", daemon=True)

    def start(self) -> "Supervisor":
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> int:
        self.done.wait(timeout)
        return self.group.exit_code()

    def _run(self) -> None:
        g = self.group
        deadline: float | None = None
        try:
            while len(g.ends) < len(g.workers):
                for i, launch in enumerate(g.workers):
                    if g.names[i] in g.ends or launch.alive():
                        continue
                    code = g.finish_worker(i, self._clock)
                    if code != 0 and deadline is None and not g.was_stopped(g.names[i]):
                        deadline = self._clock() + g.grace_s
                        left = [n for n in g.names if n not in g.ends]
                        if left:
                            self._say(f"{g.names[i]} ended with exit code {code}; stopping "
                                      f"{', '.join(left)} in {g.grace_s:g} s unless they end first "
                                      "(peers of a dead worker hang in collectives)")
                if deadline is not None and self._clock() >= deadline:
                    left = [n for n in g.names if n not in g.ends]
                    if left:
                        self._say(f"stopping {', '.join(left)}")
                        grace = max(1.0, min(g.grace_s, 10.0))
                        g.stop(left, grace_int_s=grace, grace_term_s=grace, report=self._say)
                    deadline = float("inf")
                time.sleep(self._poll_s)
        finally:
            self.done.set()


class OutputMerger:
    """Copies each worker's ``output.log`` into the group's, whole lines only, each prefixed with
    ``[N] `` (the worker index): one place to read and search every worker's output."""

    def __init__(self, group: GroupLaunch, poll_s: float = 0.1) -> None:
        self.group = group
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tpuwatch-group-output", daemon=True)

    def start(self) -> "OutputMerger":
        self._thread.start()
        return self

    def close(self) -> None:
        """Copies what is left (an unfinished last line too) and stops."""
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        g = self.group
        paths = [launch.run_dir / rundir.OUTPUT for launch in g.workers]
        offsets = [0] * len(paths)
        partial = [b""] * len(paths)
        with os.fdopen(rundir.open_append(g.run_dir / rundir.OUTPUT), "ab") as out:
            while True:
                final = self._stop.is_set()
                wrote = False
                for i, path in enumerate(paths):
                    try:
                        with rundir.open_regular(path) as f:
                            f.seek(offsets[i])
                            chunk = f.read(1 << 20)
                    except OSError:
                        continue
                    offsets[i] += len(chunk)
                    data = partial[i] + chunk
                    lines = data.split(b"\n")
                    partial[i] = lines.pop()
                    if final and partial[i]:
                        lines.append(partial[i])
                        partial[i] = b""
                    prefix = f"[{i}] ".encode()
                    for line in lines:
                        out.write(prefix + line + b"\n")
                        wrote = True
                if wrote:
                    out.flush()
                if final:
                    return
                self._stop.wait(self._poll_s)

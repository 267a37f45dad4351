"""The agent's guards around the script's process: a full disk, fork(), a terminating SIGTERM,
``os.setsid()`` in a session leader (:func:`install_session_calls`), a re-exec
(:func:`install_reexec`).

- **Full disk.** The script's stdout/stderr are ``output.log``. On ENOSPC a plain
  file object makes the script's own ``print`` raise, killing training. :class:`OutputGuard`
  puts the same file descriptors behind a writer that drops what does not fit and counts it;
  the agent's recording says what was lost when space returns (``RecordingWriter._loss_note``). Only the
  "no space" errors are swallowed: a closed pipe or a bad descriptor still raises as before.
  Cost: one Python-level ``write`` per print (~1 µs); nothing per step.
- **fork().** A child made by ``os.fork`` (multiprocessing's fork start method, a script's own
  fork) inherits the agent's objects but not its threads. Left alone, a child that exits
  normally would run the agent's end: record a second exit, remove the parent's socket. The
  child's agent is detached (:func:`_after_fork_in_child`): its messages are discarded and its
  end touches neither the socket nor the recording. Cost: nothing per step; one callback per fork.
- **SIGTERM.** A cluster's SIGTERM after the viewer has gone would otherwise leave no exit
  record (the run looks "lost"). When the script leaves SIGTERM at its default, the agent
  records the exit itself, then dies by the signal as before (:func:`_on_sigterm`). Python
  runs that handler on the main thread between bytecodes; if the main thread is stuck in a long
  native call, a watcher thread woken through the signal wakeup fd records the exit and ends the
  process with the same default SIGTERM after :data:`SIGTERM_MAIN_THREAD_GRACE_S`, so a blocked
  process still dies promptly. A script that installs its own SIGTERM handler keeps it untouched.
"""

from __future__ import annotations

import ctypes
import errno
import io
import os
import signal
import stat
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any, Mapping, Sequence, TextIO

from tpuwatch import rundir, settings
from tpuwatch.agent import clocks
from tpuwatch.protocol import OUTPUT_SOURCE, Exit

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent

#: How long the watcher waits for the main thread to run the SIGTERM handler before acting itself.
SIGTERM_MAIN_THREAD_GRACE_S = 1.0
#: How long a terminating process waits for its exit record to reach the disk.
EXIT_FLUSH_S = 1.0

_agent: "Agent | None" = None
_pid = -1
_wakeup_fds: tuple[int, int] | None = None  # the SIGTERM watcher's pipe (read end, write end)


def install(agent: "Agent") -> None:
    """Installs every guard for ``agent`` (call on the main thread, after ``agent.start()``)."""
    global _agent, _pid
    _agent, _pid = agent, os.getpid()
    guard_output(agent)
    os.register_at_fork(after_in_child=_after_fork_in_child)
    _install_sigterm(agent)
    install_session_calls(agent)


# --- full disk ----------------------------------------------------------------------------------


class OutputGuard:
    """Counts the script output a full disk made us drop (shared by stdout and stderr), and, under
    ``tpuwatch run``, takes over when the output pump is gone (:meth:`pump_gone`)."""

    def __init__(self, agent: "Agent | None" = None, pipe: tuple[int, int] | None = None) -> None:
        self.dropped_bytes = 0
        self.first_drop_t: float | None = None
        self._agent = agent
        self._pipe = pipe  # (st_dev, st_ino) of the pipe to the output pump, under tpuwatch run
        self._lock = threading.Lock()

    def pump_gone(self) -> bool:
        """A write to the output pump's pipe failed with EPIPE: the pump was killed. Points every
        descriptor of the script that is that pipe (1, 2) at output.log itself (from now on the
        script's output may wait on the run directory's disk, as before the pump), once; True if
        the write should be tried again."""
        agent, pipe = self._agent, self._pipe
        if agent is None or pipe is None:
            return False
        with self._lock:
            if self._pipe is None:
                return True  # another thread did it
            moved = []
            try:
                log = os.open(agent.run_dir / rundir.OUTPUT, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
            except OSError:
                return False
            try:
                for fd in (1, 2):
                    try:
                        st = os.fstat(fd)
                    except OSError:
                        continue
                    if (st.st_dev, st.st_ino) == pipe:
                        os.dup2(log, fd)
                        moved.append(fd)
            finally:
                os.close(log)
            self._pipe = None
        agent.event("warning", OUTPUT_SOURCE, f"the output pump is gone (killed?): the script's output "
                                         f"(descriptors {', '.join(map(str, moved)) or 'none'}) goes straight to "
                                         "output.log from here on, and waits on its disk if it is slow")
        return True

    def dropped(self, n: int) -> None:
        if self.first_drop_t is None:
            self.first_drop_t = clocks.wall()
        self.dropped_bytes += n


class _DiskFullSafeWriter(io.RawIOBase):
    """A raw writer on a file descriptor that drops, and counts, what a full disk refuses."""

    def __init__(self, fd: int, guard: OutputGuard) -> None:
        super().__init__()
        self._fd = fd
        self._guard = guard
        self._retrying = False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, b: Any) -> int:  # any bytes-like object; len() first, as the common case is bytes
        done = 0
        try:
            done = os.write(self._fd, b)
            total = len(b)
            if done == total:  # the common case: one syscall, as without the guard
                return done
            view = memoryview(b).cast("B")
            total = len(view)
            while done < total:
                done += os.write(self._fd, view[done:])
            return total
        except OSError as e:
            if e.errno == errno.EPIPE and not self._retrying and self._guard.pump_gone():
                self._retrying = True  # once: a descriptor that is still a broken pipe raises as before
                try:
                    return done + self.write(memoryview(b).cast("B")[done:])
                finally:
                    self._retrying = False
            if e.errno not in rundir.DISK_FULL_ERRNOS:
                raise
            # What did not fit is dropped; the caller sees it written (nothing to retry).
            total = memoryview(b).nbytes
            self._guard.dropped(total - done)
            return total

    def close(self) -> None:  # the descriptor belongs to the process, not to this object
        super().close()


def _wrap(stream: TextIO | None, guard: OutputGuard) -> TextIO | None:
    try:
        fd = stream.fileno() if stream is not None else -1
    except (OSError, ValueError, AttributeError):
        return stream
    if fd < 0 or not isinstance(stream, io.TextIOWrapper):
        return stream
    raw = _DiskFullSafeWriter(fd, guard)
    unbuffered = isinstance(stream.buffer, io.RawIOBase)  # python -u / PYTHONUNBUFFERED
    binary: Any = raw if unbuffered else io.BufferedWriter(raw)  # typeshed's TextIOWrapper wants a buffered one
    wrapped = io.TextIOWrapper(binary, encoding=stream.encoding, errors=stream.errors,
                               line_buffering=stream.line_buffering, write_through=unbuffered)
    return wrapped


def guard_output(agent: "Agent") -> OutputGuard:
    """Replaces ``sys.stdout``/``sys.stderr`` with writers on the same descriptors that survive a
    full disk, and a killed output pump under ``tpuwatch run``. Only regular files and the pump's
    pipe are guarded (a terminal or the user's own pipe keeps its own behaviour)."""
    pipe = None
    try:
        st = os.fstat(1)
        if settings.RUN_ID.get() and stat.S_ISFIFO(st.st_mode):
            pipe = (st.st_dev, st.st_ino)  # tpuwatch run's pipe to the output pump
    except OSError:
        pass
    guard = OutputGuard(agent, pipe)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            st = os.fstat(stream.fileno())
        except (OSError, ValueError, AttributeError):
            continue
        if not (stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) == pipe):
            continue
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
        setattr(sys, name, _wrap(stream, guard))
    agent.output_guard = guard
    return guard


# --- setsid / setpgrp ---------------------------------------------------------------------------


def _leads_own_session() -> bool:
    pid = os.getpid()
    try:
        return os.getsid(0) == pid and os.getpgrp() == pid
    except OSError:
        return False


def install_session_calls(agent: "Agent") -> None:
    """``os.setsid()``, ``os.setpgrp()`` and ``os.setpgid(0, 0)`` work as under plain python.

    ``tpuwatch run`` starts the script as the leader of its own session (away from the terminal's
    signals), and the kernel refuses these calls to a session leader (EPERM), where a script run
    by a non-interactive shell gets them. What they ask for (lead a session, or a process group,
    of one's own, with no terminal) is already so: when the call fails with EPERM for exactly
    that reason, it returns as it would have (None). The process group stays
    the one tpuwatch's stop signals, so stopping works as before. Cost: nothing until a call."""
    real_setsid, real_setpgrp, real_setpgid = os.setsid, os.setpgrp, os.setpgid
    said: set[str] = set()

    def already(call: str, e: OSError) -> bool:
        if e.errno != errno.EPERM or os.getpid() != _pid or not _leads_own_session():
            return False
        if call not in said:
            said.add(call)
            agent.event("info", "agent", f"the script called os.{call}(): it already leads its own session under "
                                         "tpuwatch (no terminal), so the call returned as it would have")
        return True

    def setsid() -> None:
        try:
            real_setsid()
        except PermissionError as e:
            if not already("setsid", e):
                raise

    def setpgrp() -> None:
        try:
            real_setpgrp()
        except PermissionError as e:
            if not already("setpgrp", e):
                raise

    def setpgid(pid: int, pgrp: int) -> None:
        try:
            real_setpgid(pid, pgrp)
        except PermissionError as e:
            own = os.getpid()
            if not (pid in (0, own) and pgrp in (0, own) and already("setpgid", e)):
                raise

    os.setsid, os.setpgrp, os.setpgid = setsid, setpgrp, setpgid


# --- re-exec -------------------------------------------------------------------------------------


def install_reexec(agent: "Agent", script: str) -> None:
    """A script that restarts itself in place (``os.execv(sys.executable, [sys.executable] +
    sys.argv)``, as restart-on-failure code does) runs on under the agent, in the same run: such
    an ``execv``/``execve`` (``os.execl*`` and ``os.execvp*`` go through them) gets ``-m
    tpuwatch.agent`` before the script and the run's directory in its environment, after the
    recording is flushed. Any other ``exec`` is left as it is. Cost: nothing until an exec."""
    real_script = os.path.realpath(script)
    execv, execve = os.execv, os.execve

    def under_agent(path: Any, args: Sequence[Any],
                    env: Mapping[str, str] | None) -> tuple[list[Any], dict[str, str]] | None:
        try:
            argv = list(args)
            if (len(argv) < 2 or os.path.realpath(os.fsdecode(path)) != os.path.realpath(sys.executable)
                    or os.path.realpath(os.fsdecode(argv[1])) != real_script):
                return None
            env = dict(os.environ if env is None else env)
            package = settings.PACKAGE_PATH.get() or os.path.dirname(os.path.dirname(os.path.dirname(
                os.path.abspath(__file__))))
            env["PYTHONPATH"] = os.pathsep.join(p for p in (package, env.get("PYTHONPATH", "")) if p)
            env[settings.PACKAGE_PATH.name] = package
            env[settings.RUN_DIR.name] = str(agent.run_dir)
            env[settings.RUN_ID.name] = agent.run_id
            agent.event("info", "agent", f"the script re-executes itself ({os.fsdecode(path)} "
                                         f"{os.fsdecode(argv[1])}): the run goes on under the agent")
            agent.flush(timeout=EXIT_FLUSH_S)
            return [argv[0], "-m", "tpuwatch.agent", *argv[1:]], env
        except Exception as e:  # never fail the script's exec: it then runs as it asked
            agent.probe_failed("reexec", e)
            return None

    def patched_execv(path: Any, args: Any) -> Any:
        rewritten = under_agent(path, args, None)
        if rewritten is None:
            return execv(path, args)
        return execve(path, *rewritten)

    def patched_execve(path: Any, args: Any, env: Any) -> Any:
        rewritten = under_agent(path, args, env)
        if rewritten is None:
            return execve(path, args, env)
        return execve(path, *rewritten)

    os.execv, os.execve = patched_execv, patched_execve  # type: ignore[assignment]  # same calls, looser types


# --- fork ---------------------------------------------------------------------------------------


def _after_fork_in_child() -> None:
    """In a forked child: the agent belongs to the parent. Discard what the child would record
    and make its end a no-op (the parent's socket and recording stay the parent's)."""
    agent = _agent
    if agent is None:
        return
    try:
        if _wakeup_fds is not None:
            # The child shares the parent's wakeup pipe: a SIGTERM to the child (Pool.terminate)
            # would wake the parent's watcher, which would end the parent. Point the child's
            # write end at /dev/null (same descriptor number, so the C handler stays harmless).
            r, w = _wakeup_fds
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, w, inheritable=False)
            os.close(devnull)
            os.close(r)
        agent.detach_after_fork()
    except Exception as e:  # never break the child's fork
        print(f"tpuwatch: could not detach the agent in a forked child: {e}", file=sys.stderr)


# --- SIGTERM ------------------------------------------------------------------------------------

_terminating = threading.Event()


def _record_signal_exit(sig: int) -> None:
    agent = _agent
    if agent is None or os.getpid() != _pid or agent.forked:
        return
    agent.emit(Exit(t=clocks.wall(), exit_code=128 + sig, signal=sig, source="agent",
                    reason=f"terminated by {signal.Signals(sig).name}"), force=True)
    agent.flush(timeout=EXIT_FLUSH_S)
    agent.before_signal_death()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Records the exit, then dies by SIGTERM exactly as the default action would."""
    if not _terminating.is_set():
        _terminating.set()
        _record_signal_exit(signum)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_sigterm(agent: "Agent") -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # the script's parent chose a disposition (ignored, ...): keep it
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        from tpuwatch.agent.agent_api import high_fd

        r, w = os.pipe()
        r, w = high_fd(r), high_fd(w)  # a script's reused low descriptor never gets the C handler's bytes
        os.set_blocking(w, False)
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (OSError, ValueError):
        return
    if old != -1:  # someone else's wakeup fd: give it back, rely on the handler alone
        signal.set_wakeup_fd(old)
        os.close(r)
        os.close(w)
        return
    global _wakeup_fds
    _wakeup_fds = (r, w)
    watcher = threading.Thread(target=_watch_wakeups, args=(r,), name="tpuwatch-signals", daemon=True)
    watcher.start()

    def stop_watching() -> None:
        # Once the script has returned nothing blocks the main thread for long: the handler alone
        # covers the rest, and the interpreter's finalization runs with no extra thread or fd.
        global _wakeup_fds
        _wakeup_fds = None
        old = signal.set_wakeup_fd(-1)
        if old != w:  # the script set its own since: leave it in place
            signal.set_wakeup_fd(old)
        os.close(w)  # the watcher reads EOF and ends
        watcher.join(timeout=1.0)

    agent.on_shutdown(stop_watching)


def _watch_wakeups(fd: int) -> None:
    """Wakes on every signal the process gets; for SIGTERM, if the main thread has not run the
    handler within the grace (stuck in native code), records the exit and ends the process."""
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            data = b""
        if not data:
            os.close(fd)
            return
        if signal.SIGTERM not in data:
            continue
        deadline = clocks.monotonic() + SIGTERM_MAIN_THREAD_GRACE_S
        while clocks.monotonic() < deadline and not _terminating.is_set():
            time.sleep(0.05)
        if _terminating.is_set() or signal.getsignal(signal.SIGTERM) is not _on_sigterm:
            continue  # handled on the main thread, or the script took SIGTERM over since
        _terminating.set()
        _record_signal_exit(signal.SIGTERM)
        # signal.signal() only works on the main thread; reset the C-level disposition instead.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal(int(signal.SIGTERM), ctypes.c_void_p(0))  # SIG_DFL
        os.kill(os.getpid(), signal.SIGTERM)

"""Asking a training process for its stacks, with a fallback for hangs that hold the GIL.

The ``stack_dump`` command is answered on the agent's server thread, so it works while training
is stuck in a collective, the input pipeline or Python code. A hang inside C code that holds the
GIL stops every Python thread, the server's too: no answer comes. Then, if the process is on this
host, :class:`StackRequest` sends it SIGUSR1, which the agent registered with ``faulthandler``
(a C-level handler that needs no GIL) to append every thread's stack to
``<run_dir>/stacks/faulthandler.txt``; the new part of that file is the dump.

No Textual here: the dashboard's stack screen polls :meth:`StackRequest.update` and renders the
:class:`StackView` it returns.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Literal, Sequence

from tpuwatch import rundir
from tpuwatch.monitor.snapshot import CommandView
from tpuwatch.protocol import StackDump

#: Seconds without an answer before the SIGUSR1 fallback (the command normally answers in ms).
FALLBACK_AFTER_S = 5.0
#: Seconds to wait for faulthandler's text after SIGUSR1.
FAULTHANDLER_WAIT_S = 5.0
FAULTHANDLER_FILE = "faulthandler.txt"  # the agent's stacks.FAULTHANDLER_FILE (no agent import here)

StackStatus = Literal["waiting", "done", "failed", "signalled"]


@dataclass(frozen=True)
class StackView:
    """What the stack screen shows."""

    status: StackStatus
    text: str = ""  # the dump
    path: str = ""  # where it is on the training host
    note: str = ""  # one line: how it was obtained, or why it failed


class StackRequest:
    """One stack-dump request, followed until it has text or has failed.

    ``pid`` and ``host``: the training process, when known; the SIGUSR1 fallback is only tried for
    a process on this host (``hostname()``), with a run directory to read the file from.
    """

    def __init__(
        self,
        command_id: str,
        *,
        run_dir: Path | None,
        pid: int | None,
        host: str = "",
        clock: Callable[[], float] = time.monotonic,
        fallback_after_s: float = FALLBACK_AFTER_S,
        kill: Callable[[int, int], None] | None = None,
        hostname: Callable[[], str] = rundir.hostname,
    ) -> None:
        self.command_id = command_id
        self.run_dir = run_dir
        self.pid = pid
        self._local = bool(run_dir is not None and pid and (not host or host == hostname()))
        self._clock = clock
        self._started = clock()
        self._fallback_after_s = fallback_after_s
        self._kill = kill or self._kill_run_process
        self._known_dumps: set[str] | None = None
        self._signalled_at: float | None = None
        self._fault_offset = 0
        self._view = StackView("waiting", note="asking the training process for its stacks…")

    @classmethod
    def taken(cls, dump: StackDump, note: str) -> "StackRequest":
        """A request answered already: stacks the agent took by itself (a stall's)."""
        request = cls("", run_dir=None, pid=None)
        request._view = StackView("done", text=dump.text, path=dump.path, note=note)
        return request

    def _kill_run_process(self, pid: int, sig: int) -> None:
        """``os.kill`` for the run's own process only, as a stop sends its signals
        (:func:`~tpuwatch.control.run_stop.target_of`): named with its identity by a run.json of
        this user's, and never a process its pid was reused by."""
        from tpuwatch.control.run_stop import StopError, target_of

        if self.run_dir is None:
            raise PermissionError(errno.EPERM, "no run directory names the training process")
        try:
            process = target_of(self.run_dir).process
        except StopError as e:
            raise PermissionError(errno.EPERM, str(e)) from None
        if process.pid != pid:
            raise PermissionError(errno.EPERM, f"the run's run.json names process {process.pid}, not {pid}")
        if not process.is_ours():
            raise ProcessLookupError(errno.ESRCH, "the training process has ended (its pid is not the run's)")
        os.kill(pid, sig)

    @property
    def fault_path(self) -> Path | None:
        return self.run_dir / "stacks" / FAULTHANDLER_FILE if self.run_dir is not None else None

    def remember_existing(self, dumps: Iterable[StackDump]) -> None:
        """Dumps that were there before this request (so an old one is not taken for the answer)."""
        self._known_dumps = {d.path or d.text[:200] for d in dumps}

    def update(self, commands: Sequence[CommandView], dumps: Sequence[StackDump]) -> StackView:
        if self._view.status in ("done", "failed"):
            return self._view
        if self._signalled_at is not None:
            return self._read_faulthandler()
        cmd = next((c for c in commands if c.id == self.command_id), None)
        if cmd is not None and cmd.status == "failed":
            self._view = StackView("failed", note=cmd.message or "the agent refused the stack dump")
            return self._view
        if cmd is not None and cmd.status == "done":
            path = str(cmd.details.get("path", "")) if cmd.details else ""
            known = self._known_dumps or set()
            dump = next((d for d in reversed(dumps) if (path and d.path == path)
                         or (not path and (d.path or d.text[:200]) not in known)), None)
            if dump is not None:
                self._view = StackView("done", text=dump.text, path=dump.path,
                                       note=f"stack dump of the training process, written to {dump.path}")
                return self._view
        if self._clock() - self._started < self._fallback_after_s:
            return self._view
        if cmd is not None and cmd.status == "done":  # answered, but its text never came
            self._view = StackView("failed", note=cmd.message or "the stack dump's text did not arrive")
            return self._view
        return self._signal()

    def _signal(self) -> StackView:
        if not self._local or self.fault_path is None or not hasattr(signal, "SIGUSR1"):
            self._view = StackView("failed", note=(
                f"no answer from the agent in {self._fallback_after_s:g} s, and the process is not on this host "
                "(run `kill -USR1 PID` there; the stacks go to <run_dir>/stacks/faulthandler.txt)"))
            return self._view
        try:
            self._fault_offset = self.fault_path.stat().st_size
        except OSError:
            self._fault_offset = 0
        try:
            self._kill(self.pid, signal.SIGUSR1)  # type: ignore[arg-type]
        except OSError as e:
            self._view = StackView("failed", note=f"no answer from the agent, and SIGUSR1 to pid {self.pid} "
                                                  f"failed: {e.strerror or e}")
            return self._view
        self._signalled_at = self._clock()
        self._view = StackView("signalled", note=f"no answer from the agent in {self._fallback_after_s:g} s "
                                                 f"(a hang holding the GIL?); sent SIGUSR1 to pid {self.pid}…")
        return self._view

    def _read_faulthandler(self) -> StackView:
        path = self.fault_path
        assert path is not None and self._signalled_at is not None
        try:
            with rundir.open_regular(path) as f:
                f.seek(self._fault_offset)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            text = ""
        waited = self._clock() - self._signalled_at
        # faulthandler writes all threads in one go; a short quiet time means it is complete.
        if text.strip() and waited >= 0.5:
            self._view = StackView("done", text=text, path=str(path),
                                   note=f"faulthandler dump (SIGUSR1; the agent did not answer), in {path}")
        elif waited >= FAULTHANDLER_WAIT_S:
            self._view = StackView("failed", note=f"no answer to the command nor to SIGUSR1 (pid {self.pid}); "
                                                  "the process may not have the tpuwatch agent's handler")
        return self._view

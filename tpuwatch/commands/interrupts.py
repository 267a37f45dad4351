"""Ctrl-C while tpuwatch supervises a training: SIGINT to the training, then SIGTERM, then
SIGKILL, each said on stderr."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any, Callable

from tpuwatch import settings
from tpuwatch.commands.lines import say

_HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _hangup(signum: int, frame: Any) -> None:
    """A hangup (SSH drop) is not a stop. A Python handler, not SIG_IGN: an ignored signal stays
    ignored in the programs started meanwhile (the training), a handled one goes back to its
    default there."""


class Forwarding:
    """Ctrl-C (or SIGTERM) sends SIGINT to the training, again SIGTERM, then SIGKILL; a hangup
    (SSH drop) is ignored: it must not end the training. ``targets()`` gives the processes
    (:class:`tpuwatch.monitor.runs.Process`): whether each group lives, and each signal, is
    decided there (a pid reused by another process after the run's ended gets nothing).

    Installed (:func:`forward_interrupts`) before the training starts: a Ctrl-C that comes while
    ``targets()`` has no process yet (the launch under way) is sent by :meth:`catch_up`, called
    once they exist. (Installed after the launch, a Ctrl-C in those ~0.1 s ended tpuwatch quietly
    and left the training, in its own session, running.) :meth:`hand_over` puts the handlers
    back where the dashboard takes Ctrl-C over (a key there).

    A script that ignores SIGINT (started with ``nohup`` or ``&``) is escalated without a second
    Ctrl-C: SIGTERM after the grace period (``TPUWATCH_STOP_GRACE_S``, default 15 s), SIGKILL
    the same time later, each said on stderr."""

    def __init__(self, what: str, targets: Callable[[], list]) -> None:
        self._what = what
        self._targets = targets
        self._interrupts = 0  # the furthest level asked for: 1 SIGINT, 2 SIGTERM, 3 SIGKILL
        self._missed = False  # a Ctrl-C came while no process existed: catch_up sends it
        self._lock = threading.RLock()  # the signal handler may interrupt the main thread inside send()
        self._grace = settings.STOP_GRACE_S.positive_float()
        self._previous = {sig: signal.getsignal(sig) for sig in _HANDLED}
        self._install()

    def _install(self) -> None:
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGHUP, _hangup)

    @property
    def interrupted(self) -> bool:
        """A Ctrl-C (or SIGTERM) came since it was installed."""
        return self._interrupts > 0

    def hand_over(self) -> bool:
        """The handlers as they were before, for the dashboard; False, with this forwarding kept,
        where a Ctrl-C came first (the training is being stopped: its end is followed headless)."""
        if self.interrupted:
            return False
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if self.interrupted:  # it came as they were put back: it was forwarded
            self._install()
            return False
        return True

    def catch_up(self) -> None:
        """Sends what a Ctrl-C asked for before the training's processes existed."""
        with self._lock:
            if not self._missed:
                return
            self._missed = False
            level, processes = self._interrupts, list(self._targets())
        if processes:
            self._signal_all(level, processes)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._send(self._interrupts + 1)

    def _send(self, level: int) -> None:
        with self._lock:
            if level <= self._interrupts:
                return  # a Ctrl-C already went further
            self._interrupts = level
            processes = list(self._targets())
            if not processes:
                self._missed = True
                return
            self._missed = False  # this one reaches them: catch_up has nothing left to send
        self._signal_all(level, processes)

    def _signal_all(self, level: int, processes: list) -> None:
        sig = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)[min(level, 3) - 1]
        if level < self._interrupts:
            return  # a later Ctrl-C (its handler ran in between) already sent more
        say(f"sending {sig.name} to {self._what}" + (" (Ctrl-C again to escalate)" if level < 3 else ""))
        for process in processes:
            if level < self._interrupts:
                return
            process.signal(sig)
        if level < 3:
            threading.Thread(target=self._escalate, args=(level, processes), name="tpuwatch-escalate",
                             daemon=True).start()

    def _escalate(self, level: int, processes: list) -> None:
        deadline = time.monotonic() + self._grace
        while time.monotonic() < deadline:
            if not any(p.group_alive() for p in processes) or self._interrupts > level:
                return
            time.sleep(0.1)
        if any(p.group_alive() for p in processes) and self._interrupts == level:
            say(f"{self._what} still running {self._grace:g} s after {('SIGINT', 'SIGTERM')[level - 1]}")
            self._send(level + 1)


def forward_interrupts(what: str, targets: Callable[[], list]) -> Forwarding:
    """Installs a :class:`Forwarding` of Ctrl-C to ``targets()`` (``what``: how stderr names them)."""
    return Forwarding(what, targets)

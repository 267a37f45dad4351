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
    """What :func:`forward_interrupts` installed: :meth:`catch_up` once the training has started,
    :meth:`hand_over` where the dashboard takes Ctrl-C over (a key there)."""

    def __init__(self, on_signal: Callable[[int, Any], None], catch_up: Callable[[], None],
                 interrupted: Callable[[], bool]) -> None:
        self._on_signal = on_signal
        self.catch_up = catch_up
        self._interrupted = interrupted
        self._previous = {sig: signal.getsignal(sig) for sig in _HANDLED}
        self._install()

    def _install(self) -> None:
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGHUP, _hangup)

    @property
    def interrupted(self) -> bool:
        """A Ctrl-C (or SIGTERM) came since it was installed."""
        return self._interrupted()

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


def forward_interrupts(what: str, targets: Callable[[], list]) -> Forwarding:
    """Ctrl-C (or SIGTERM) sends SIGINT to the training, again SIGTERM, then SIGKILL; a hangup
    (SSH drop) is ignored: it must not end the training. ``targets()`` gives the processes
    (:class:`tpuwatch.monitor.runs.Process`): whether each group lives, and each signal, is
    decided there (a pid reused by another process after the run's ended gets nothing).

    Installed before the training starts: a Ctrl-C that comes while ``targets()`` has no process
    yet (the launch under way) is sent by :meth:`Forwarding.catch_up`, called once they exist.
    (Installed after the launch, a Ctrl-C in those ~0.1 s ended tpuwatch quietly and left the
    training, in its own session, running.)

    A script that ignores SIGINT (started with ``nohup`` or ``&``) is escalated without a second
    Ctrl-C: SIGTERM after the grace period (``TPUWATCH_STOP_GRACE_S``, default 15 s), SIGKILL
    the same time later, each said on stderr."""
    interrupts = 0
    missed = False  # a Ctrl-C came while no process existed: catch_up sends it
    lock = threading.RLock()  # the signal handler may interrupt the main thread inside send()
    grace = settings.STOP_GRACE_S.positive_float()

    def send(level: int) -> None:
        nonlocal interrupts, missed
        with lock:
            if level <= interrupts:
                return  # a Ctrl-C already went further
            interrupts = level
            processes = list(targets())
            if not processes:
                missed = True
                return
            missed = False  # this one reaches them: catch_up has nothing left to send
        signal_all(level, processes)

    def signal_all(level: int, processes: list) -> None:
        sig = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)[min(level, 3) - 1]
        if level < interrupts:
            return  # a later Ctrl-C (its handler ran in between) already sent more
        say(f"sending {sig.name} to {what}" + (" (Ctrl-C again to escalate)" if level < 3 else ""))
        for process in processes:
            if level < interrupts:
                return
            process.signal(sig)
        if level < 3:
            threading.Thread(target=escalate, args=(level, processes), name="tpuwatch-escalate", daemon=True).start()

    def catch_up() -> None:
        nonlocal missed
        with lock:
            if not missed:
                return
            missed = False
            level, processes = interrupts, list(targets())
        if processes:
            signal_all(level, processes)

    def escalate(level: int, processes: list) -> None:
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not any(p.group_alive() for p in processes) or interrupts > level:
                return
            time.sleep(0.1)
        if any(p.group_alive() for p in processes) and interrupts == level:
            say(f"{what} still running {grace:g} s after {('SIGINT', 'SIGTERM')[level - 1]}")
            send(level + 1)

    def on_signal(signum: int, frame: Any) -> None:
        send(interrupts + 1)

    return Forwarding(on_signal, catch_up, lambda: interrupts > 0)

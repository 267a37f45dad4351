"""Ctrl-C while tpuwatch supervises a training: SIGINT to the training, then SIGTERM, then
SIGKILL, each said on stderr."""

from __future__ import annotations

import signal
import threading
import time

from tpuwatch import settings
from tpuwatch.commands.lines import say


def forward_interrupts(what: str, targets) -> None:
    """Ctrl-C (or SIGTERM) sends SIGINT to the training, again SIGTERM, then SIGKILL; a hangup
    (SSH drop) is ignored: it must not end the training. ``targets()`` gives the processes
    (:class:`tpuwatch.monitor.runs.Process`): whether each group lives, and each signal, is
    decided there (a pid reused by another process after the run's ended gets nothing).

    A script that ignores SIGINT (started with ``nohup`` or ``&``) is escalated without a second
    Ctrl-C: SIGTERM after the grace period (``TPUWATCH_STOP_GRACE_S``, default 15 s), SIGKILL
    the same time later, each said on stderr."""
    interrupts = 0
    lock = threading.RLock()  # the signal handler may interrupt the main thread inside send()
    grace = settings.STOP_GRACE_S.positive_float()

    def send(level: int) -> None:
        nonlocal interrupts
        with lock:
            if level <= interrupts:
                return  # a Ctrl-C already went further
            interrupts = level
        sig = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)[min(level, 3) - 1]
        processes = list(targets())
        say(f"sending {sig.name} to {what}" + (" (Ctrl-C again to escalate)" if level < 3 else ""))
        for process in processes:
            process.signal(sig)
        if level < 3:
            threading.Thread(target=escalate, args=(level, processes), name="tpuwatch-escalate", daemon=True).start()

    def escalate(level: int, processes: list) -> None:
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not any(p.group_alive() for p in processes) or interrupts > level:
                return
            time.sleep(0.1)
        if any(p.group_alive() for p in processes) and interrupts == level:
            say(f"{what} still running {grace:g} s after {('SIGINT', 'SIGTERM')[level - 1]}")
            send(level + 1)

    def on_signal(signum, frame):
        send(interrupts + 1)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

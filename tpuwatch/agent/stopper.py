"""The ``stop`` action: a viewer that cannot signal the training process (``tpuwatch attach
HOST:PORT`` on another machine) asks the agent to stop the run.

Answered at once, from the server thread: the request is recorded (an Event from the viewer, so
``ls`` and ``report`` say "stopped"), then the process interrupts itself as Ctrl-C would
(SIGINT: the script's ``finally`` blocks and the agent's exit record run), escalating to SIGTERM
and SIGKILL if it is still alive after the same grace periods a local stop uses.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import TYPE_CHECKING, Any

from tpuwatch.protocol import STOP_SOURCE, EventFact

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.protocol import Command

GRACE_INT_S = 15.0
GRACE_TERM_S = 10.0
#: Set while the script runs (``tpuwatch.agent.__main__`` sets it as the script starts and clears
#: it as it ends). A stop asked for before then (a viewer that connects as soon as the agent
#: listens) waits for the script: an interrupt during the agent's own start-up would end the
#: process in the agent's code, with no exit recorded.
SCRIPT_RUNNING = threading.Event()
#: How long a stop asked for before the script started waits for it.
START_WAIT_S = 120.0


class Stopper:
    def __init__(self, agent: "Agent", grace_int_s: float = GRACE_INT_S, grace_term_s: float = GRACE_TERM_S) -> None:
        self.agent = agent
        self.grace_int_s = grace_int_s
        self.grace_term_s = grace_term_s
        self._started = threading.Event()

    def handle(self, cmd: "Command") -> tuple[str | None, dict[str, Any]]:
        if self._started.is_set():
            return "a stop is already under way", {}
        self._started.set()
        by = f"a remote viewer (command {cmd.id})"
        self.agent.event("warning", STOP_SOURCE, f"stop requested from {by}", fact=EventFact.STOP_REQUESTED,
                         subject=by)
        threading.Thread(target=self._escalate, name="tpuwatch-stop", daemon=True).start()
        return (f"stopping: SIGINT now, SIGTERM after {self.grace_int_s:g} s, "
                f"SIGKILL after {self.grace_int_s + self.grace_term_s:g} s"), {}

    def _escalate(self) -> None:
        pid = os.getpid()
        SCRIPT_RUNNING.wait(START_WAIT_S)
        if SCRIPT_RUNNING.is_set():  # not once the script has ended: the process is exiting already
            os.kill(pid, signal.SIGINT)
        # The process ends (and this daemon thread with it) if the script honours the interrupt.
        for sig, wait_s in ((signal.SIGTERM, self.grace_int_s), (signal.SIGKILL, self.grace_term_s)):
            threading.Event().wait(wait_s)
            self.agent.event("warning", STOP_SOURCE, f"still running {wait_s:g} s later: sending {sig.name}")
            self.agent.flush(timeout=1.0)
            os.kill(pid, sig)

"""A remote stop asked for before the script started (a viewer that sends ``stop`` as soon as
the agent listens) interrupts the script once it runs, never the agent's own start-up: the
interrupt there ended the process inside the agent, with no exit recorded (the viewer read "the
agent closed the connection without recording an exit"). Real signals, a real Agent."""

from __future__ import annotations

import signal
import threading
import time

from tpuwatch.agent import stopper
from tpuwatch.agent.runtime import Agent
from tpuwatch.protocol import Command


def test_a_stop_before_the_script_runs_waits_for_it(tmp_path):
    agent = Agent(run_dir=tmp_path, run_id="t")
    got = threading.Event()
    old = signal.signal(signal.SIGINT, lambda *a: got.set())
    stopper.SCRIPT_RUNNING.clear()
    try:
        # grace periods past any test run: the escalation thread never sends SIGTERM to pytest
        s = stopper.Stopper(agent, grace_int_s=1e9, grace_term_s=1e9)
        s.handle(Command(id="c1", action="stop"))
        time.sleep(0.5)
        assert not got.is_set(), "interrupted before the script ran"
        stopper.SCRIPT_RUNNING.set()  # the script starts
        deadline = time.monotonic() + 10
        while not got.is_set():
            assert time.monotonic() < deadline, "no interrupt once the script ran"
            time.sleep(0.05)
    finally:
        stopper.SCRIPT_RUNNING.clear()
        signal.signal(signal.SIGINT, old)
        agent.stop()

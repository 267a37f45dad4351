"""The teardown probe: an object freed slowly on the training thread, timed from its last
reference dropping to its attributes freed; the agent's thread samples the stack meanwhile.

A stand-in for a tf.data iterator (whose resource's C++ destructor joins tf.data's threads): an
object whose attribute set first takes a while to free. No TensorFlow needed."""

from __future__ import annotations

import threading
import time

from tpuwatch.agent.runtime import Agent
from tpuwatch.agent.teardown import TeardownProbe
from tpuwatch.protocol import Teardown


class SlowResource:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __del__(self) -> None:
        time.sleep(self.seconds)  # a C++ destructor joining a thread


class FakeIterator:
    def __init__(self, seconds: float) -> None:
        self._resource = SlowResource(seconds)


class FakeMultiDevice:
    """Holds a per-device iterator of its own (as TensorFlow's multi-device iterator does)."""

    def __init__(self, probe: TeardownProbe, seconds: float) -> None:
        self._resource = SlowResource(seconds)
        self._device = FakeIterator(seconds)
        probe.created(self._device)


def teardowns(agent: Agent) -> list[Teardown]:
    """The probe's messages: the training thread's and the agent's thread's (a sampler's return)."""
    return [m for m in agent._buf if isinstance(m, Teardown)]


def drop_slowly(probe: TeardownProbe, seconds: float) -> None:
    it = FakeIterator(seconds)
    probe.created(it)
    del it  # the epoch's iterator, deleted at its boundary


def test_a_long_deletion_is_one_teardown_with_its_cpu_and_the_stack_sampled_during_it(tmp_path, monkeypatch):
    monkeypatch.setattr("tpuwatch.agent.teardown.PROGRESS_EVERY_S", 0.1)
    agent = Agent(tmp_path, "r")
    probe = TeardownProbe(agent, thread=threading.get_ident(), long_s=0.3, in_step=lambda: False)
    stop = threading.Event()

    def agent_thread() -> None:
        while not stop.is_set():
            for m in probe():
                agent.emit(m)
            time.sleep(0.05)

    sampler = threading.Thread(target=agent_thread)
    sampler.start()
    try:
        t0 = time.time()
        drop_slowly(probe, 0.6)
        t1 = time.time()
    finally:
        stop.set()
        sampler.join()
    *progress, msg = teardowns(agent)
    assert not msg.under_way and progress and all(m.under_way and m.since == msg.since for m in progress)
    assert all(msg.since + 0.3 <= m.t < msg.t for m in progress)  # past long_s, before the end
    assert t0 <= msg.since < msg.t <= t1 and msg.t - msg.since >= 0.6
    assert msg.iterator == "FakeIterator" and msg.cpu_s < 0.3
    assert msg.stack and msg.stack[0].startswith("test_teardown.py:") and " in __del__: time.sleep" in msg.stack[0]
    assert any("in drop_slowly: del it" in line for line in msg.stack)
    assert msg.site == msg.stack[0]  # this file is the script: its innermost line


def test_short_ones_other_threads_and_those_inside_a_step_are_not_reported(tmp_path):
    agent = Agent(tmp_path, "r")
    probe = TeardownProbe(agent, thread=threading.get_ident(), long_s=0.3, in_step=lambda: False)
    drop_slowly(probe, 0.01)
    assert probe.timed == 1 and not teardowns(agent)
    other = threading.Thread(target=drop_slowly, args=(probe, 0.4))
    other.start()
    other.join()
    assert probe.timed == 1 and not teardowns(agent)
    in_step = TeardownProbe(agent, thread=threading.get_ident(), long_s=0.3, in_step=lambda: True)
    drop_slowly(in_step, 0.4)
    assert in_step.timed == 0 and not teardowns(agent)


def test_nested_iterators_count_once_from_the_outermost(tmp_path):
    agent = Agent(tmp_path, "r")
    probe = TeardownProbe(agent, thread=threading.get_ident(), long_s=0.3, in_step=lambda: False)
    outer = FakeMultiDevice(probe, 0.2)
    probe.created(outer)
    del outer
    (msg,) = teardowns(agent)
    assert msg.t - msg.since >= 0.4
    assert probe.timed == 1


def test_a_failure_disables_the_probe_and_never_reaches_the_script(tmp_path):
    agent = Agent(tmp_path, "r")

    def broken() -> float:
        raise RuntimeError("clock gone")

    probe = TeardownProbe(agent, thread=threading.get_ident(), long_s=0.0, in_step=lambda: False, cpu=broken)
    drop_slowly(probe, 0.0)  # raises nothing here
    assert not probe.enabled and "teardown" in agent.disabled_probes
    drop_slowly(probe, 0.0)
    assert not teardowns(agent)


def test_a_deletion_whose_end_never_came_leaves_the_next_untimed_not_misnamed(tmp_path):
    agent = Agent(tmp_path, "r")
    probe = TeardownProbe(agent, thread=threading.get_ident(), long_s=0.3, in_step=lambda: False)
    probe.begin("OwnedIterator", -1)  # its iterator's last attribute was never freed
    time.sleep(0.4)
    drop_slowly(probe, 0.01)  # would otherwise close a 0.4 s "teardown" begun by the other
    assert not teardowns(agent) and probe.timed == 0


def test_a_deletion_whose_end_never_came_is_not_reported_under_way_once_steps_run_again(tmp_path):
    # A copy of the iterator shares its last attribute (copy.copy copies __dict__): the original's
    # deletion began and its end never came. The sampler said "under way" every second for the
    # rest of the run, and the ledger booked every later gap between steps as teardown.
    agent = Agent(tmp_path, "r")
    probe = TeardownProbe(agent, thread=threading.get_ident(), long_s=0.1, in_step=lambda: False)
    probe.begin("OwnedIterator", -1)
    time.sleep(0.15)
    assert [m.under_way for m in probe()] == [True]  # nothing says yet that it is not a pause
    agent.global_step += 1  # a step ran: the training thread is not inside that deletion
    time.sleep(1.1)
    assert probe() == []
    drop_slowly(probe, 0.2)  # the next deletion is timed again
    (msg,) = [m for m in teardowns(agent) if not m.under_way]
    assert msg.t - msg.since >= 0.2


def test_a_disabled_probe_reports_nothing_under_way(tmp_path):
    agent = Agent(tmp_path, "r")
    probe = TeardownProbe(agent, thread=threading.get_ident(), long_s=0.0, in_step=lambda: False)
    probe.begin("OwnedIterator", -1)
    probe.enabled = False  # stop() or a failure between the deletion's start and end
    time.sleep(0.05)
    assert probe() == []


def test_a_deletion_whose_end_never_came_is_dropped_once_the_thread_runs_on_without_a_step(tmp_path):
    # An evaluation (no training step) went on after such a deletion began: its 8 s were booked
    # as iterator teardown, out of 'evaluating'. A thread inside a deletion is blocked: its
    # innermost frame stays where it is.
    agent = Agent(tmp_path, "r")
    stop = threading.Event()
    ready = threading.Event()
    holder: dict = {}

    def evaluation() -> None:
        holder["probe"] = probe = TeardownProbe(agent, thread=threading.get_ident(), long_s=0.3,
                                                in_step=lambda: False)
        probe.begin("OwnedIterator", -1)  # its end never comes
        ready.set()
        n = 0
        while not stop.is_set():  # the evaluation's loop runs on: Python, no training step
            n = sum(i for i in range(200)) + n % 7

    thread = threading.Thread(target=evaluation)
    thread.start()
    try:
        ready.wait(10)
        probe = holder["probe"]
        out = []
        for _ in range(8):
            out += probe()
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join(10)
    assert out == [] and probe._since is None

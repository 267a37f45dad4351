"""The agent states what a viewer acts on as typed Event fields (protocol.EventFact), and the
viewer reads those fields, not the message (in-process, no TensorFlow needed)."""

from __future__ import annotations

from tpuwatch import protocol
from tpuwatch.agent.runtime import Agent
from tpuwatch.monitor.state import RunState
from tpuwatch_testing import read_messages


def test_a_disabled_probe_is_sent_as_a_fact_and_shown_from_it(tmp_path):
    agent = Agent(run_dir=tmp_path, run_id="t")
    agent.probe_failed("input_wait", RuntimeError("no get_next\nmore lines"))
    agent.probe_failed("input_wait", RuntimeError("said once"))
    agent.stop()
    events = [m for m in read_messages(tmp_path / "events.jsonl") if isinstance(m, protocol.Event)]
    assert [(e.fact, e.subject, e.reason) for e in events] == [
        (protocol.EventFact.PROBE_DISABLED, "input_wait", "RuntimeError: no get_next")]
    # Reworded for people, the same fact for the viewer.
    state = RunState()
    state.apply(protocol.Event(t=1.0, level="warning", source="agent", message="input timing went away",
                               fact=events[0].fact, subject=events[0].subject, reason=events[0].reason))
    assert state.snapshot(now=2.0).disabled_probes == {"input_wait": "RuntimeError: no get_next"}

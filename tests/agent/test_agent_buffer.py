"""The agent's in-memory buffer is bounded: if its writer thread falls behind (a starved
or stuck agent thread), what does not fit is counted and said in the recording, and the training
thread's memory does not grow (in-process, no TensorFlow needed)."""

from __future__ import annotations

from tpuwatch import protocol
from tpuwatch.agent import runtime
from tpuwatch.agent.runtime import Agent
from tpuwatch_testing import read_messages


def test_messages_past_the_buffer_bound_are_counted_and_said(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "MAX_BUFFERED", 50)
    agent = Agent(run_dir=tmp_path, run_id="t")  # its thread not started: nothing drains
    for i in range(120):
        agent.emit(protocol.Event(t=float(i), level="info", source="test", message=f"m{i}"))
    agent.emit_step((1, 1.0, 0.01, None, 0.5))
    assert len(agent._buf) == 50
    agent.stop()
    msgs = read_messages(tmp_path / "events.jsonl")
    kept = [m for m in msgs if isinstance(m, protocol.Event) and m.source == "test"]
    assert [m.message for m in kept] == [f"m{i}" for i in range(50)]  # the oldest kept, in order
    (note,) = [m for m in msgs if isinstance(m, protocol.Event) and m.source == "agent" and "dropped" in m.message]
    assert "71 messages" in note.message and note.level == "warning"


def test_a_step_that_cannot_be_built_is_an_error_event_and_the_recording_goes_on(tmp_path):
    agent = Agent(run_dir=tmp_path, run_id="t")
    agent.emit_step(("not", "a", "step", "at", "all", "too", "many", "fields", "for", "a", "step", "record", "!"))
    agent.emit(protocol.Event(t=1.0, level="info", source="test", message="after"))
    agent.stop()
    msgs = read_messages(tmp_path / "events.jsonl")
    (bad,) = [m for m in msgs if isinstance(m, protocol.Event) and m.source == "agent"]
    assert bad.level == "error" and bad.message.startswith("could not encode step:")
    assert [m.message for m in msgs if isinstance(m, protocol.Event) and m.source == "test"] == ["after"]

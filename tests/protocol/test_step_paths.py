"""One Step, every path: a Step with every field set leaves the agent's step probe,
becomes a recording line, and comes back equal from the fast decoder, the generic decoder and a
remote viewer's stream. A field added to ``protocol.Step`` but not set by the agent, or carried by
one path and not another, fails here. No TensorFlow: the probe's record path needs none."""

from __future__ import annotations

import dataclasses
import json
import time
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuwatch import protocol, rundir
from tpuwatch.agent.runtime import Agent
from tpuwatch.agent.steps import StepProbe
from tpuwatch.agent.transport import Server
from tpuwatch.monitor.recording import read_all
from tpuwatch.protocol import Step
from tpuwatch.sources.remote_source import RemoteSource

T = 1_750_000_000.25


def _unset(msg: Step) -> list[str]:
    """Fields of ``msg`` left at their default, ``None`` or empty: what a path did not carry."""
    out = []
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        if value is None or value in ((), "") or (f.default is not dataclasses.MISSING and value == f.default):
            out.append(f.name)
    return out


def _full(cls: type = Step) -> Step:
    """A ``cls`` with every field set to a value unlike its default, made from the field types
    alone (a new field is filled without editing this test)."""
    by_type = {"int": 7, "int | None": 64, "float": 0.125, "float | None": 0.5, "str": "train_step",
               "tuple[float, ...]": (0.25, 0.75)}
    values = {}
    for i, f in enumerate(dataclasses.fields(cls)):
        v = by_type[str(f.type)]
        values[f.name] = v + i if isinstance(v, (int, float)) else v
    return cls(**values)


def _agent_step(agent: Agent) -> Step:
    """The Step the agent's step probe records for one call of 4 steps with every figure known."""
    probe = StepProbe(agent)
    probe.epoch_source = SimpleNamespace(epoch=3)
    agent.global_step = 40
    probe._emit("train_step", 4, 0.01, 0.002, (0.25, 0.75), 64)
    (values,) = [m for m in agent._buf if type(m) is tuple]
    return Step(*values)


def _paths(msg: Step, tmp_path) -> None:
    """Encoded once; back equal through the fast and the generic decoder and a recording."""
    line = protocol.encode(msg)
    # The fast encoder writes what the generic walk over the fields writes, byte for byte.
    assert line == (json.dumps(protocol.to_dict(msg), separators=(",", ":")) + "\n").encode()
    # And so does the writer's, from the values alone.
    assert protocol.encode_step_values(dataclasses.astuple(msg)) == line
    assert line.startswith(protocol.STEP_LINE_PREFIX)
    assert protocol.decode_step_line(line.rstrip(b"\n")) == msg  # the fast path took it
    assert protocol.decode(line) == msg
    path = tmp_path / f"{id(msg)}.jsonl"
    path.write_bytes(line)
    assert read_all(path)[0] == [msg]


def test_a_step_with_every_field_set_survives_every_path(tmp_path):
    agent = Agent(run_dir=tmp_path, run_id="t", clock=lambda: T)
    server = Server(agent, None, ("127.0.0.1", 0), token="tok")
    server.start()
    source = None
    try:
        recorded = _agent_step(agent)
        assert _unset(recorded) == [], "protocol.Step has a field the agent's step probe does not set"
        assert recorded == Step(step=44, t=T, step_time_s=0.01, input_wait_s=0.002, loss=0.5,
                                replica_losses=(0.25, 0.75), steps=4, examples=64, function="train_step", epoch=3)
        full = _full()
        assert _unset(full) == []
        agent.emit(full)
        for msg in (recorded, full):
            _paths(msg, tmp_path)
        agent.flush()
        # The agent's own recording, then a remote viewer's stream of it.
        steps = [m for m in _recorded(tmp_path / rundir.EVENTS) if type(m) is Step]
        assert steps == [recorded, full]
        source = RemoteSource([server.tcp_address], "tok", reconnect_s=(0.05, 0.2))
        got: list = []
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            got += [m for m in source.poll() if type(m) is Step]
            time.sleep(0.02)
        assert got == [recorded, full]
    finally:
        if source is not None:
            source.close()
        agent.stop()


def _recorded(path) -> list:
    messages, stats = read_all(path)
    assert stats.malformed == 0 and stats.unknown == 0
    return messages


def test_a_field_added_to_step_is_on_every_fast_path():
    @dataclasses.dataclass(frozen=True)
    class Wider(Step):
        tokens: int | None = None  # a field a newcomer adds

    values, to_dict, decode_line, encode_values = protocol._make_step_paths(Wider)
    msg = _full(Wider)
    assert msg.tokens is not None
    assert values(**{f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}) == \
        tuple(getattr(msg, f.name) for f in dataclasses.fields(msg))
    data = to_dict(msg)
    assert data == protocol.to_dict(msg)
    assert decode_line(json.dumps(data).encode()) == msg
    assert encode_values(dataclasses.astuple(msg)) == (json.dumps(data, separators=(",", ":")) + "\n").encode()


def test_a_field_type_with_no_fast_path_stops_the_import():
    @dataclasses.dataclass(frozen=True)
    class Odd(Step):
        note: dict[str, int] | None = None

    try:
        protocol._make_step_paths(Odd)
    except TypeError as e:
        assert "Odd.note" in str(e) and "_FAST_TYPES" in str(e)
    else:
        raise AssertionError("a field with no fast path was accepted")


def test_odd_step_lines_leave_the_fast_path():
    good = protocol.encode(_full()).rstrip(b"\n")
    assert protocol.decode_step_line(good) is not None
    for old, new in ((b'"steps":13', b'"steps":true'), (b'"t":1.125', b'"t":"NaN"'),
                     (b'"replica_losses":[0.25,0.75]', b'"replica_losses":"ab"'),
                     (b'"function":"train_step"', b'"function":5'), (b'"loss":', b'"lost":')):
        bad = good.replace(old, new)
        assert bad != good, old
        assert protocol.decode_step_line(bad) is None, new


_floats = st.floats(allow_nan=True, allow_infinity=True)
_ints = st.integers(min_value=-(2**70), max_value=2**70)


@settings(max_examples=300, deadline=None)
@given(step=_ints, t=_floats, step_time_s=_floats, input_wait_s=st.none() | _floats, loss=st.none() | _floats,
       replica_losses=st.lists(_floats, max_size=8).map(tuple), steps=_ints, examples=st.none() | _ints,
       function=st.text(max_size=40), epoch=st.none() | _ints)
def test_the_writer_encodes_a_steps_values_as_the_generic_encoder_does(**fields):
    """The agent's writer encodes the values the training thread kept (no Step built) into the
    same bytes as the generic encoder, for any value the fields' types allow: non-finite floats,
    big integers, quotes, control characters and non-ASCII in a name."""
    values = protocol.step_values(**fields)
    assert protocol.encode_step_values(values) == protocol.encode(Step(*values))


class _Number(float):
    """A float of another type (as a NumPy float64 is): JSON writes it as a float."""


def test_the_writer_falls_back_for_values_of_other_types():
    """A bool, an int where the field says float, a float subclass (a NumPy float64) take the
    generic path: the same line, or the same error, as ``encode(Step(...))``."""
    odd = protocol.step_values(step=True, t=_Number(1.5), step_time_s=2, input_wait_s=None, loss=None)
    assert protocol.encode_step_values(odd) == protocol.encode(Step(*odd))
    bad = protocol.step_values(step=object(), t=1.0, step_time_s=0.5, input_wait_s=None, loss=None)
    with pytest.raises(TypeError):
        protocol.encode(Step(*bad))
    with pytest.raises(TypeError):
        protocol.encode_step_values(bad)

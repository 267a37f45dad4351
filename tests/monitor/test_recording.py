"""RecordingReader: incremental reads, held-back partial lines, truncated tails, caps, speed."""

from __future__ import annotations

import math

import pytest
from monitor_recordings import DATA, encode_all, mr, step

from tpuwatch import protocol
from tpuwatch.monitor.recording import (
    RecordingReader,
    iter_recording,
    read_all,
)
from tpuwatch.protocol import Exit, Hello, Step


def test_partial_line_is_held_back_until_its_newline(tmp_path):
    path = tmp_path / "events.jsonl"
    hello = protocol.encode(mr.hello())
    s1 = protocol.encode(step(1, mr.T0 + 1))
    path.write_bytes(hello + s1[:30])
    r = RecordingReader(path)
    got = r.read_new()
    assert [type(m) for m in got] == [Hello]
    assert r.offset == len(hello)
    assert r.pending_bytes == 30
    assert r.read_new() == []  # nothing new: still waiting for the rest of the line
    with open(path, "ab") as f:
        f.write(s1[30:])
    got = r.read_new()
    assert [m.step for m in got] == [1]
    assert r.offset == len(hello) + len(s1)
    assert r.stats.truncated_tail is False


def test_missing_file_reads_empty_then_catches_up(tmp_path):
    path = tmp_path / "events.jsonl"
    r = RecordingReader(path)
    assert r.read_new() == [] and r.caught_up
    path.write_bytes(protocol.encode(mr.hello()))
    assert len(r.read_new()) == 1


def test_finish_reports_cut_tail_and_dropped_bytes(tmp_path):
    msgs = mr.healthy_messages(50)
    data = encode_all(msgs)
    path = tmp_path / "events.jsonl"
    path.write_bytes(data[:-25])  # the exit line loses its end
    messages, stats = read_all(path)
    assert stats.truncated_tail is True
    assert stats.dropped_bytes == len(protocol.encode(msgs[-1])) - 25
    assert len(messages) == len(msgs) - 1
    assert stats.malformed == 0  # a cut tail is not counted as a malformed line
    assert not any(isinstance(m, Exit) for m in messages)


def test_final_line_missing_only_its_newline_is_kept(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(encode_all([mr.hello(), Exit(t=mr.T0 + 1, exit_code=0)])[:-1])
    r = RecordingReader(path)
    assert len(r.read_new()) == 1
    last = r.finish()
    assert [type(m) for m in last] == [Exit]
    assert r.stats.truncated_tail is False and r.stats.messages == 2


def test_checked_in_truncated_recording():
    messages, stats = read_all(DATA / "running_truncated.jsonl")
    assert stats.truncated_tail and stats.dropped_bytes > 0
    assert not any(isinstance(m, Exit) for m in messages)


def test_malformed_and_unknown_lines_are_counted_never_raised(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(
        protocol.encode(mr.hello())
        + b"not json\n"
        + b'{"kind":"from_the_future","x":1}\n'
        + b'{"kind":"step","step":"one","t":1}\n'  # fast path declines, full decoder rejects
        + b"\n   \n"
        + protocol.encode(step(1, mr.T0 + 1))
    )
    messages, stats = read_all(path)
    assert [type(m) for m in messages] == [Hello, Step]
    assert stats.malformed == 2 and stats.unknown == 1
    assert "step" in stats.last_error


def test_read_cap_makes_progress_in_chunks(tmp_path):
    msgs = [mr.hello()] + [step(i, mr.T0 + i) for i in range(1, 2001)]
    path = tmp_path / "events.jsonl"
    path.write_bytes(encode_all(msgs))
    r = RecordingReader(path, max_bytes_per_read=16 * 1024)
    calls, total = 0, []
    while True:
        got = r.read_new()
        total += got
        calls += 1
        if r.caught_up:
            break
    assert total == msgs
    assert calls >= path.stat().st_size // (16 * 1024)  # really capped
    assert r.offset == path.stat().st_size


def test_line_longer_than_the_cap_is_still_read(tmp_path):
    long_event = protocol.Event(t=1.0, level="info", source="agent", message="x" * 50_000)
    path = tmp_path / "events.jsonl"
    path.write_bytes(encode_all([long_event, step(1, 2.0)]))
    r = RecordingReader(path, max_bytes_per_read=1024)
    got = r.read_new()
    assert got and got[0] == long_event


def test_over_long_line_is_skipped_and_counted(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"x" * (protocol.MAX_LINE_BYTES + 10) + b"\n" + protocol.encode(step(1, 2.0)))
    messages, stats = read_all(path)
    assert [m.step for m in messages] == [1]
    assert stats.malformed == 1


def test_fast_step_path_matches_the_full_decoder():
    cases = [
        step(7, 1.5),
        Step(step=3, t=2, step_time_s=1, input_wait_s=None, loss=None),  # ints, Nones, defaults
        Step(step=4, t=2.0, step_time_s=0.1, input_wait_s=0.0, loss=math.nan,
             replica_losses=(1.0, math.nan, math.inf, 2.0), steps=4, examples=128, epoch=2),
    ]
    for msg in cases:
        line = protocol.encode(msg).rstrip(b"\n")
        full = protocol.decode(line)
        fast = protocol.decode_step_line(line)
        if fast is not None:  # non-finite values take the full path
            assert fast == full
        (dec,) = read_into_list(line + b"\n")
        assert repr(dec) == repr(full)  # repr: nan != nan
    assert protocol.decode_step_line(b'{"kind":"step","step":1.5,"t":1,"step_time_s":1,"input_wait_s":null,'
                      b'"loss":null}') is None
    assert protocol.decode_step_line(b'{"kind":"step","step":1,"t":true,"step_time_s":1,"input_wait_s":null,'
                      b'"loss":null}') is None


def read_into_list(data: bytes) -> list:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "e.jsonl"
        p.write_bytes(data)
        return read_all(p)[0]


def test_iter_recording_streams_with_final_stats():
    it, reader = iter_recording(DATA / "healthy_4replica.jsonl")
    n = sum(1 for _ in it)
    assert n == reader.stats.messages > 300
    assert reader.stats.bytes_read == (DATA / "healthy_4replica.jsonl").stat().st_size


def test_read_all_of_a_missing_file_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no recording"):
        read_all(tmp_path / "nope.jsonl")


@pytest.mark.slow
def test_read_all_decodes_every_line_of_a_long_recording(tmp_path):
    """200,000 step lines (with the fast path for step lines) come back whole and in order. The
    rate is measured by bench/model_costs.py, not asserted here."""
    path = tmp_path / "events.jsonl"
    # Real encoder output for one record, then the same shape with changing numbers (fast to
    # write; the reader sees what an agent writes).
    proto = protocol.encode(step(1, mr.T0 + 0.05, losses=(0.51, 0.49, 0.5, 0.52)))
    head, tail = proto.split(b'"step":1,', 1)
    with open(path, "wb") as f:
        f.write(protocol.encode(mr.hello()))
        f.write(b"".join(head + b'"step":%d,' % i + tail for i in range(1, 200_001)))
    messages, stats = read_all(path)
    assert stats.messages == 200_001 and stats.malformed == 0
    assert [m.step for m in messages[1:]] == list(range(1, 200_001))


def test_last_step_is_found_wherever_the_chunks_cut_it(tmp_path, monkeypatch):
    """Read backwards in chunks: the last step line is found whole whether a chunk's edge falls
    before it, inside it or after it; a last line without its newline is not taken."""
    from tpuwatch.monitor import recording

    monkeypatch.setattr(recording, "TAIL_BYTES", 97)
    path = tmp_path / "events.jsonl"
    for pad in range(0, 300, 7):
        after = [protocol.Event(t=mr.T0 + 2, level="info", source="agent", message="x" * pad)] * 3
        data = encode_all([mr.hello(), step(5, mr.T0), step(6, mr.T0 + 1), *after])
        path.write_bytes(data + protocol.encode(step(7, mr.T0 + 3))[:-1])
        found = recording.last_step(path)
        assert found is not None and found.step == 6, pad
    path.write_bytes(encode_all([mr.hello(), protocol.Event(t=mr.T0, level="info", source="agent", message="")]))
    assert recording.last_step(path) is None
    assert recording.last_step(tmp_path / "missing.jsonl") is None

"""The sources that feed the dashboard: replay timing and seeking, output.log tailing."""

from __future__ import annotations

from pathlib import Path

import pytest
from ui_support import DATA, FakeClock

from tpuwatch.protocol import Command, Event, Step
from tpuwatch.sources.replay_source import ReplaySource, make_replay_source
from tpuwatch.ui.output_tail import OutputTail, clean_line


def steps(n: int, t0: float = 1000.0) -> list:
    return [Step(step=i, t=t0 + i, step_time_s=1.0, input_wait_s=None, loss=None) for i in range(1, n + 1)]


def test_replay_releases_by_time_and_speed() -> None:
    clock = FakeClock(0.0)
    src = ReplaySource(steps(10), speed=2.0, clock=clock)
    assert [m.step for m in src.poll()] == [1]  # the cursor starts at the first message
    clock.t = 2.0  # 4 recorded seconds at 2x
    assert [m.step for m in src.poll()] == [2, 3, 4, 5]
    src.toggle_pause()
    clock.t = 100.0
    assert src.poll() == [] and src.position == 1005.0
    src.toggle_pause()
    clock.t = 200.0
    assert [m.step for m in src.poll()] == [6, 7, 8, 9, 10] and src.at_end


def test_replay_seek_back_restarts_generation() -> None:
    clock = FakeClock(0.0)
    src = ReplaySource(steps(10), clock=clock, paused=True)
    src.seek_end()
    assert len(src.poll()) == 10 and src.generation == 0
    src.seek(-4.0)
    assert src.generation == 1
    assert [m.step for m in src.poll()] == [1, 2, 3, 4, 5, 6]  # everything up to the new cursor
    src.seek(2.0)
    assert src.generation == 1 and [m.step for m in src.poll()] == [7, 8]


def test_replay_keeps_untimed_messages_in_place_and_speed_steps() -> None:
    msgs = [*steps(2), Command(id="x", action="profile"), Event(t=1003.0, level="info", source="a", message="m")]
    src = ReplaySource(msgs, clock=FakeClock(0.0), paused=True)
    src.seek_end()
    assert src.poll() == msgs
    src.faster()
    src.faster()
    assert src.speed == 4.0
    for _ in range(20):
        src.slower()
    assert src.speed == 0.25
    with pytest.raises(ValueError, match="speed must be positive"):
        ReplaySource(msgs, speed=0)


def test_make_replay_source_reads_a_recording() -> None:
    src = make_replay_source(DATA / "healthy_4replica.jsonl", speed=8.0)
    assert src.speed == 8.0 and src.end_t - src.start_t > 10
    with pytest.raises(FileNotFoundError, match="no recording"):
        make_replay_source(DATA / "nope.jsonl")


def test_clean_line() -> None:
    assert clean_line("\x1b[32mok\x1b[0m") == "ok"
    assert clean_line(" 1/10 [==>   ]\r 5/10 [=====>]\r10/10 [=======]") == "10/10 [=======]"


def test_output_tail_partial_lines_and_truncation(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    tail = OutputTail(path)
    assert tail.read_lines() == []  # not written yet
    path.write_bytes(b"one\ntw")
    assert tail.read_lines() == ["one"]
    with open(path, "ab") as f:
        f.write("o \xe2\x82".encode("latin-1"))  # half of a UTF-8 euro sign
    assert tail.read_lines() == []
    with open(path, "ab") as f:
        f.write(b"\xac\nthree\n")
    assert tail.read_lines() == ["two €", "three"]
    path.write_bytes(b"new\n")  # rotated: shorter than what we read
    assert tail.read_lines() == ["new"]


def test_output_tail_starts_near_the_end_of_a_long_log(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    path.write_text("".join(f"line {i}\n" for i in range(1000)))
    lines = OutputTail(path, start_bytes=100).read_lines()
    assert lines[-1] == "line 999" and len(lines) < 20 and all(line.startswith("line ") for line in lines)


def test_replay_poll_is_bounded_per_call() -> None:
    from tpuwatch.sources import replay_source

    src = ReplaySource(steps(replay_source.MAX_MESSAGES_PER_POLL + 5), clock=FakeClock(0.0), paused=True)
    src.seek_end()
    assert len(src.poll()) == replay_source.MAX_MESSAGES_PER_POLL
    assert len(src.poll()) == 5


def test_replay_keeps_offsets_not_messages_and_decodes_the_same(tmp_path):
    """make_replay_source indexes the file (16 bytes a message) and decodes slices on demand:
    what it releases equals what the full reader reads, and a cut last line is said."""
    from tpuwatch import protocol
    from tpuwatch.monitor.recording import read_all
    from tpuwatch.sources.replay_source import RecordedMessages

    src_path = Path(__file__).resolve().parents[1] / "data" / "healthy_4replica.jsonl"
    path = tmp_path / "events.jsonl"
    path.write_bytes(src_path.read_bytes() + b'{"kind":"step","step":99')  # cut mid-line
    expected, stats = read_all(path)
    lazy = RecordedMessages(path)
    assert stats.truncated_tail and lazy.truncated_bytes == stats.dropped_bytes
    assert len(lazy) == len(expected) + 1 and len(lazy.release) == len(lazy)
    assert lazy[0:len(expected)] == expected
    assert lazy[5:9] == expected[5:9] and lazy[3] == expected[3]
    tail = lazy[len(expected)]
    assert isinstance(tail, protocol.Event) and "cut line" in tail.message
    src = make_replay_source(tmp_path, speed=1.0)
    src.seek_end()
    released = []
    while batch := src.poll():
        released.extend(batch)
    assert released[:-1] == expected and released[-1] == tail


def test_every_source_defines_every_method_of_the_source_protocol() -> None:
    """The dashboard and headless mode call these without probing (no getattr); mypy checks the
    signatures, this checks that nothing was left out of a source that mypy does not see used."""
    from tpuwatch.sources.file_source import FileSource
    from tpuwatch.sources.group_source import GroupReplaySource, GroupSource
    from tpuwatch.sources.remote_source import RemoteSource
    from tpuwatch.sources.source import RecordingSource, ReplayControl, Source

    methods = {n for n, v in vars(Source).items() if callable(v) and not n.startswith("_")}
    assert {"poll", "poll_tagged", "health", "read_stats", "send", "now", "close"} <= methods
    for cls in (FileSource, GroupSource, RemoteSource, ReplaySource, GroupReplaySource):
        assert not {n for n in methods if not callable(getattr(cls, n, None))}, cls
    for cls in (FileSource, GroupSource):
        assert callable(cls.finish) and isinstance(vars(cls)["caught_up"], property), cls
    assert {"caught_up", "finish"} <= set(vars(RecordingSource))
    assert isinstance(vars(ReplaySource)["seek_step_s"], property) and "seek_step_s" in vars(ReplayControl)

"""A source that releases a recorded run's messages by their time, at a chosen speed.

``tpuwatch replay RUN`` feeds the same dashboard as a live run; the dashboard drives this
object's transport controls (pause, speed, seek). Seeking backwards bumps ``generation`` so
the consumer rebuilds its state from the first message (state is a fold over messages; there
is no cheap "undo").
"""

from __future__ import annotations

import bisect
import time
from array import array
from pathlib import Path
from typing import Callable, Mapping, Sequence

from tpuwatch import rundir
from tpuwatch.monitor.recording import ReadStats
from tpuwatch.protocol import Command, Decoder, Event, Message
from tpuwatch.sources.source import Tagged, WorkerHealth

#: Most messages one poll returns: a jump to the end of a million-step recording is applied
#: over several refreshes (the app stops draining when its time budget is spent).
MAX_MESSAGES_PER_POLL = 4_000
#: Playback speeds the +/- keys step through (recorded seconds per wall second).
SPEEDS: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)


class ReplaySource:
    """Releases ``messages`` whose recorded time is at or before the replay cursor.

    The cursor moves by ``speed`` recorded seconds per second of ``clock`` while not paused.
    Messages without a time (commands) keep their place in the recording.
    """

    live = False
    can_send = False

    def __init__(
        self,
        messages: Sequence[Message],
        *,
        speed: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        paused: bool = False,
    ) -> None:
        if speed <= 0:
            raise ValueError(f"replay speed must be positive, got {speed}")
        if isinstance(messages, RecordedMessages):
            self._messages: Sequence[Message] = messages
            self._release: Sequence[float] = messages.release
        else:
            self._messages = list(messages)
            self._release = release_times(self._messages)
        self._start = self._release[0] if self._release else 0.0
        self._end = self._release[-1] if self._release else 0.0
        self._clock = clock
        self._last_wall = clock()
        self._cursor = self._start
        self._next = 0  # index of the first message not yet released
        self.speed = speed
        self.paused = paused
        self.generation = 0

    # --- Source ----------------------------------------------------------------------------

    def poll(self) -> Sequence[Message]:
        self._advance()
        stop = bisect.bisect_right(self._release, self._cursor, lo=self._next)
        stop = min(stop, self._next + MAX_MESSAGES_PER_POLL)
        out = self._messages[self._next : stop]
        self._next = stop
        return out

    def poll_tagged(self) -> Sequence[Tagged]:
        return [(None, m) for m in self.poll()]

    def health(self) -> Mapping[str, WorkerHealth]:
        return {}  # a recording's workers are as it says

    def read_stats(self) -> ReadStats | None:
        return None  # read whole before the replay starts; its problems are in the messages

    def send(self, command: Command) -> None:
        raise OSError("a replay cannot send commands")

    def now(self) -> float | None:
        return self._cursor

    def close(self) -> None:
        pass

    # --- ReplayControl ---------------------------------------------------------------------

    @property
    def position(self) -> float:
        return self._cursor

    @property
    def start_t(self) -> float:
        return self._start

    @property
    def end_t(self) -> float:
        return self._end

    @property
    def at_end(self) -> bool:
        return self._cursor >= self._end

    @property
    def seek_step_s(self) -> float:
        """How far one seek key moves: 5% of the recording (20 presses cross it), at least one
        second. A fraction rather than a number of steps: a step is 10 ms in one run and 10 s in
        another, and a recording's minutes before the first step (compiling) have none."""
        return max(1.0, (self._end - self._start) / 20)

    def toggle_pause(self) -> None:
        self._advance()
        self.paused = not self.paused

    def faster(self) -> None:
        self._advance()
        self.speed = next((s for s in SPEEDS if s > self.speed), self.speed)

    def slower(self) -> None:
        self._advance()
        self.speed = next((s for s in reversed(SPEEDS) if s < self.speed), self.speed)

    def seek(self, delta_s: float) -> None:
        self._advance()
        self._move_to(self._cursor + delta_s)

    def seek_start(self) -> None:
        self._advance()
        self._move_to(self._start)

    def seek_end(self) -> None:
        self._advance()
        self._move_to(self._end)

    # --- internals -------------------------------------------------------------------------

    def _advance(self) -> None:
        wall = self._clock()
        if not self.paused:
            self._cursor = min(self._end, self._cursor + (wall - self._last_wall) * self.speed)
        self._last_wall = wall

    def _move_to(self, t: float) -> None:
        t = min(self._end, max(self._start, t))
        if t < self._cursor:
            self.generation += 1
            self._next = 0
        self._cursor = t


def release_times(messages: Sequence[Message]) -> list[float]:
    """Release time of each message: its own t, never earlier than the one before it, so the
    file order (the order the state saw live) is kept; leading untimed messages go with the
    first timed one."""
    release: list[float] = []
    last = None
    for msg in messages:
        t = getattr(msg, "t", None)
        if isinstance(t, (int, float)):
            last = float(t) if last is None else max(last, float(t))
        release.append(last if last is not None else 0.0)
    if last is not None:
        first_t = next(r for r, m in zip(release, messages) if hasattr(m, "t"))
        release = [r if r else first_t for r in release]
    return release


class RecordedMessages(Sequence):
    """A recording's messages, decoded from the file when a slice is asked for.

    Keeps 16 bytes a message (its byte offset and release time) instead of the message itself:
    a 1,000,000-step recording replays in tens of MB instead of ~750 MB.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offsets = array("q")
        self.release = array("d")
        self.truncated_bytes = 0
        decoder = Decoder()
        last = None
        leading = 0  # untimed messages before the first timed one
        pos = 0
        with rundir.open_regular(path) as f:
            for line in f:
                start, pos = pos, pos + len(line)
                if not line.endswith(b"\n"):
                    self.truncated_bytes = len(line)
                    break
                msg = decoder.decode(line)
                if msg is None:
                    continue
                t = getattr(msg, "t", None)
                if isinstance(t, (int, float)):
                    if last is None:
                        self.release.extend([float(t)] * leading)
                    last = float(t) if last is None else max(last, float(t))
                    self.release.append(last)
                elif last is None:
                    leading += 1
                else:
                    self.release.append(last)
                self._offsets.append(start)
        if last is None:
            self.release.extend([0.0] * leading)
        self._end_offset = pos - self.truncated_bytes
        self.malformed = decoder.malformed
        # Said where the replay ends, like a live viewer learns it: a cut last line.
        self._extra: list[Message] = []
        if self.truncated_bytes:
            self._extra.append(Event(t=last or 0.0, level="warning", source="recording",
                                     message=f"the recording ends in a cut line ({self.truncated_bytes} bytes dropped)"))
            self.release.append(last or 0.0)

    def __len__(self) -> int:
        return len(self._offsets) + len(self._extra)

    def __getitem__(self, index):
        if not isinstance(index, slice):
            return self[index:index + 1][0]
        start, stop, _ = index.indices(len(self))
        n = len(self._offsets)
        out: list[Message] = []
        if start < min(stop, n):
            first = self._offsets[start]
            end = self._offsets[stop] if stop < n else self._end_offset
            with rundir.open_regular(self.path) as f:
                f.seek(first)
                data = f.read(end - first)
            decoder = Decoder()
            out = [m for m in map(decoder.decode, data.splitlines()) if m is not None]
        out.extend(self._extra[max(0, start - n):max(0, stop - n)])
        return out


def make_replay_source(run_dir: Path, speed: float = 1.0, *, paused: bool = False) -> ReplaySource:
    """The source ``tpuwatch replay RUN`` gives the dashboard (``RUN`` a run dir or a .jsonl)."""
    path = Path(run_dir) / rundir.EVENTS if Path(run_dir).is_dir() else Path(run_dir)
    if not path.exists():
        raise FileNotFoundError(f"no recording at {path}")
    return ReplaySource(RecordedMessages(path), speed=speed, paused=paused)

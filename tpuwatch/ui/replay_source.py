"""A source that releases a recorded run's messages by their time, at a chosen speed.

``tpuwatch replay RUN`` feeds the same dashboard as a live run; the dashboard drives this
object's transport controls (pause, speed, seek). Seeking backwards bumps ``generation`` so
the consumer rebuilds its state from the first message (state is a fold over messages; there
is no cheap "undo").
"""

from __future__ import annotations

import bisect
import time
from pathlib import Path
from typing import Callable, Sequence

from tpuwatch import rundir
from tpuwatch.protocol import Command, Message

#: Most messages one poll returns: a jump to the end of a million-step recording is applied
#: over several refreshes (the app stops draining when its time budget is spent).
MAX_MESSAGES_PER_POLL = 20_000
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
        self._messages = list(messages)
        # Release time of each message: its own t, never earlier than the one before it, so
        # the file order (the order the state saw live) is kept.
        self._release: list[float] = []
        last = None
        for msg in self._messages:
            t = getattr(msg, "t", None)
            if isinstance(t, (int, float)):
                last = float(t) if last is None else max(last, float(t))
            self._release.append(last if last is not None else 0.0)
        if last is not None:
            # Leading messages without a time replay with the first timed one.
            first_t = next(r for r, m in zip(self._release, self._messages) if hasattr(m, "t"))
            self._release = [r if r else first_t for r in self._release]
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
        """How far one seek key moves: 2% of the recording, at least one second."""
        return max(1.0, (self._end - self._start) / 50)

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


def read_recording(run_dir: Path) -> list[Message]:
    """Every message in ``run_dir``'s events.jsonl. Raises ``FileNotFoundError`` if absent."""
    from tpuwatch.monitor.recording import read_all

    path = Path(run_dir) / rundir.EVENTS if Path(run_dir).is_dir() else Path(run_dir)
    if not path.exists():
        raise FileNotFoundError(f"no recording at {path}")
    messages, _stats = read_all(path)
    return messages


def make_replay_source(run_dir: Path, speed: float = 1.0, *, paused: bool = False) -> ReplaySource:
    """The source ``tpuwatch replay RUN`` gives the dashboard (``RUN`` a run dir or a .jsonl)."""
    return ReplaySource(read_recording(run_dir), speed=speed, paused=paused)

"""The dashboard's reading, off the UI thread: a source drained into one ``RunState``, the
findings evaluated (and recorded by the process that owns the run), output.log tailed; each
round hands the UI one immutable :class:`Frame`.

One thread owns a :class:`SourceReader` (its state, findings feed, pacer, source and output
tail): the dashboard's reader worker, or the UI thread itself when the app runs no reader
thread (``refresh_hz=0``: tests that drive ``pull``). Any other thread asks for a change with
:meth:`SourceReader.submit`, run by the owner before its next read, and reads only the frames it
is handed (frozen values, the snapshot included).
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from tpuwatch import rundir
from tpuwatch.monitor.baseline import Baseline
from tpuwatch.monitor.diskspace import full_note
from tpuwatch.monitor.monitor import Monitor
from tpuwatch.monitor.recording import append
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.protocol import Finding, Message, StackDump
from tpuwatch.sources.source import ReplayControl, Source, apply_worker_health
from tpuwatch.ui.output_tail import OutputTail
from tpuwatch.ui.pacer import Pacer
from tpuwatch.ui.widgets.replay_bar import ReplayState

#: Longest one read may spend applying messages before it hands a frame over (seconds):
#: catching up on a long recording happens over several frames instead of holding the screen
#: at a stale frame.
APPLY_BUDGET_S = 0.15
#: A replay holds its whole output.log up to this size to follow the replay position.
REPLAY_OUTPUT_MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class Frame:
    """One read's result, for the UI thread: immutable values only."""

    now: float  # the unix time the snapshot is for (a replay's cursor)
    snapshot: RunSnapshot | None  # None: nothing worth drawing yet (the pacer)
    stack_dumps: tuple[StackDump, ...] = ()
    replay: ReplayState | None = None
    output: tuple[str, ...] = ()  # new lines of output.log (live, or a too-long replay log's end)
    replay_output: tuple[str, ...] | None = None  # a replay's whole output.log, on the first read
    replay_output_too_long: bool = False  # the first read found it too long to follow the replay
    errors: tuple[str, ...] = ()  # for people, in the order they happened


class SourceReader:
    """Drains ``source`` into a :class:`~tpuwatch.monitor.monitor.Monitor` (a ``RunState`` and the
    findings feed beside it), one :meth:`read` at a time.

    ``record_findings``: append new findings to the run's recording (only the process that owns
    the run does); the findings go into the state directly, and their lines, when this reader
    reaches them in the recording, are not applied a second time (``FindingsFeed.read_back``).
    """

    def __init__(
        self,
        source: Source,
        *,
        clock: Callable[[], float],
        show_period_s: float,
        run_dir: Path | None = None,
        record_findings: bool = False,
        baseline: Baseline | None = None,
    ) -> None:
        self.source = source
        self._clock = clock
        self._baseline = baseline
        self.run_dir = run_dir
        self._replay: ReplayControl | None = source if isinstance(source, ReplayControl) else None
        self._generation = self._replay.generation if self._replay else 0
        self._pacer = Pacer(show_period_s)
        self._record_to = (run_dir / rundir.EVENTS
                           if record_findings and run_dir is not None and self._replay is None else None)
        self._errors: list[str] = []
        self._ops: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.monitor = self._new_monitor()
        self.state = self.monitor.state
        self._tail: OutputTail | None = None
        if run_dir is not None:
            # A replay shows the whole log; a live view starts near the end of a long one.
            self._tail = OutputTail(run_dir / rundir.OUTPUT, start_bytes=1 << 62 if self._replay else 1 << 20)
        self._replay_loaded = False
        self._follows_tail = False  # a replay's output.log too long to hold: its end only
        self._disk_checked_at = float("-inf")
        self._disk_note = ""

    def _new_monitor(self) -> Monitor:
        # A live view: the rolling figures only (no whole-run step times held).
        return Monitor(self._clock, on_new=self._record if self._record_to else None, baseline=self._baseline,
                       step_figures=False)

    # --- asked by other threads -------------------------------------------------------------

    def submit(self, op: Callable[[], None]) -> None:
        """Runs ``op`` on the owner's thread before its next read (a replay control, a message
        of the viewer's own). Thread-safe; ``op`` must not raise."""
        self._ops.put(op)

    def apply_local(self, make: Callable[[float], Message]) -> None:
        """Applies ``make(now)``, the viewer's own message (a command it sent, a failure), to the
        state before the next read; ``now`` is the source's time (a replay's cursor)."""
        self.submit(lambda: self.state.apply(make(self._now())))

    # --- the owner's thread -------------------------------------------------------------------

    def _now(self) -> float:
        now = self.source.now()
        return self._clock() if now is None else now

    def read(self) -> Frame:
        """Drains what the source has (within :data:`APPLY_BUDGET_S`), evaluates the findings and
        returns the frame to show. Only the owning thread calls this."""
        while True:
            try:
                op = self._ops.get_nowait()
            except queue.Empty:
                break
            op()
        replay = self._replay
        if replay is not None and replay.generation != self._generation:
            # The cursor moved back: everything is read again from the start.
            self._generation = replay.generation
            self._pacer.reset()
            self.monitor = self._new_monitor()
            self.state = self.monitor.state
        take = self.monitor.take
        # Several workers' streams (a group, several HOST:PORT): each message with its worker.
        poll = self.source.poll_tagged
        deadline = time.perf_counter() + APPLY_BUDGET_S
        backlog = False  # the budget ran out with messages still coming: more are waiting
        try:
            while True:
                batch = poll()
                for worker, msg in batch:
                    take(msg, worker)  # skips this reader's own findings: in the state since found
                if not batch:
                    break
                if time.perf_counter() > deadline:
                    backlog = True
                    break
            apply_worker_health(self.source, self.state)
            stats = self.source.read_stats()
            if stats is not None:  # unreadable lines: the header says so when nothing else came
                self.state.note_read_stats(malformed=stats.malformed, unknown=stats.unknown,
                                           truncated_tail=stats.truncated_tail)
        except OSError as e:
            self._errors.append(f"reading the run failed: {e}")
        now = self._now()
        self.monitor.evaluate(now)
        disk = self._disk_full_note()
        snap: RunSnapshot | None = None
        # The state counts its news: a snapshot is built only when one is shown.
        if self._pacer.due((self.state.version, disk, backlog), time.monotonic()):
            snap = self.monitor.snapshot(now)
            if disk or backlog:
                snap = replace(snap, disk_full=disk, catching_up=backlog)
        output, replay_output, too_long = self._read_output()
        frame = Frame(now=now, snapshot=snap, stack_dumps=self.state.stack_dumps,
                      replay=self._replay_position(), output=output, replay_output=replay_output,
                      replay_output_too_long=too_long)
        if self._errors:
            frame = replace(frame, errors=tuple(self._errors))
            self._errors.clear()
        return frame

    def _record(self, findings: list[Finding]) -> None:
        assert self._record_to is not None  # the feed calls it only then
        try:
            append(self._record_to, findings)
        except OSError as e:
            self._errors.append(f"cannot record findings: {e}")

    def _disk_full_note(self) -> str:
        """Live runs: whether the run directory's disk is full (one statvfs every 2 s)."""
        if self.run_dir is None or not self.source.live:
            return ""
        t = time.monotonic()
        if t >= self._disk_checked_at + 2.0:
            self._disk_checked_at = t
            self._disk_note = full_note(self.run_dir)
        return self._disk_note

    def _replay_position(self) -> ReplayState | None:
        r = self._replay
        if r is None:
            return None
        # from the launch, as the header's elapsed time (the first message comes ~1 s after it)
        started = self.state.started_t
        origin = min(r.start_t, started) if started is not None else r.start_t
        return ReplayState(paused=r.paused, speed=r.speed, position_s=r.position - origin,
                           duration_s=r.end_t - origin, at_end=r.at_end)

    def _read_output(self) -> tuple[tuple[str, ...], tuple[str, ...] | None, bool]:
        """output.log: a live run's new lines; a replay's whole log once (the UI shows as much
        of it as the replay position has reached), or its end when too long to hold."""
        if self._tail is None:
            return (), None, False
        if self._replay is not None and not self._follows_tail:
            if self._replay_loaded:
                return (), None, False
            self._replay_loaded = True
            lines: list[str] = []
            try:
                if self._tail.path.stat().st_size > REPLAY_OUTPUT_MAX_BYTES:
                    self._tail = OutputTail(self._tail.path, start_bytes=1 << 20)
                    self._follows_tail = True
                    return (), None, True
                while chunk := self._tail.read_lines():  # bounded: the size checked above
                    lines.extend(chunk)
                lines.extend(self._tail.flush())
            except FileNotFoundError:
                pass
            except OSError as e:
                self._errors.append(f"reading output.log failed: {e}")
            return (), tuple(lines), False
        try:
            new = self._tail.read_lines()
        except OSError as e:
            self._errors.append(f"reading output.log failed: {e}")
            return (), None, False
        return tuple(new), None, False

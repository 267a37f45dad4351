"""The script's output on its way to ``output.log``: a pipe, drained by this small process.

``python -m tpuwatch.control.output_pump RUN_DIR`` with stdin the reading end of the pipe that is
the script's stdout and stderr (one pipe: their interleaving is kept) and stdout ``output.log``.

Why a pipe and a process of its own: written straight to ``output.log``, every
``print`` waited on the run directory's disk; on a disk taking 50 ms a write a script printing once
a step went from 234 to 8.88 steps/s. Here one thread reads the pipe into a bounded buffer as fast
as the script writes, another appends the buffer to the file, so the script never waits on the
disk. When the disk falls behind by more than :data:`BUFFER_BYTES`, the oldest output not yet
written is dropped and counted (the end of a run, a crash's traceback, is what must reach the
file); a full disk drops what it refuses, as the agent does for the recording. Both are said in
the recording (``events.jsonl``): a warning when output runs :data:`LATE_S` late, and a
``disk-full`` note of what was dropped (the report lists it).

Why not the viewer: if the viewer owned the pipe, its death would kill training with SIGPIPE
(docs/architecture.md, "What the code rests on"). This process belongs to no terminal (its own session, SIGINT/SIGHUP/SIGTERM
ignored), is outside the training's process group (a stop signals that group, never this), and
reads until every writer has closed the pipe: what the script wrote just before a crash,
``os._exit`` or SIGKILL is still in the pipe and reaches the file.
"""

from __future__ import annotations

import collections
import os
import signal
import sys
import threading
import time
from pathlib import Path

from tpuwatch import protocol, rundir

#: Output held in memory while the disk falls behind; beyond it the oldest is dropped.
BUFFER_BYTES = 8 << 20
#: Output this many seconds late on its way to the file makes one warning (per episode).
LATE_S = 2.0
#: At most one note of dropped output this often while dropping goes on (and one at the end).
NOTE_EVERY_S = 5.0
READ_BYTES = 1 << 16
#: What the pipe can hold before a write of the script's would wait for this process.
PIPE_BYTES = 1 << 20

LATE_MESSAGE = "the script's output reaches output.log late"


def widen_pipe(fd: int) -> None:
    """Asks for a :data:`PIPE_BYTES` pipe (Linux; the system's cap may give less)."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except (OSError, ImportError):
        pass  # the default 64 KiB: bursts past it wait for this process, never for the disk


class Pump:
    """Reads ``src`` into a bounded buffer; appends it to ``dst``; notes delays and drops in
    ``events``. ``clock`` is the wall clock (event times), ``mono`` measures the delay."""

    def __init__(self, src: int, dst: int, events: Path | None, *, buffer_bytes: int = BUFFER_BYTES,
                 clock=time.time, mono=time.monotonic) -> None:
        self.src, self.dst, self.events = src, dst, events
        self.buffer_bytes = buffer_bytes
        self.clock, self.mono = clock, mono
        self._chunks: collections.deque[tuple[float, bytes]] = collections.deque()
        self._size = 0
        self._eof = False
        self._cond = threading.Condition()
        self.dropped_late = 0  # bytes dropped because the disk fell behind by a whole buffer
        self.dropped_full = 0  # bytes a full disk (or a broken file) refused
        self._reported_late = self._reported_full = 0
        self._first_drop_t: float | None = None
        self._last_note = float("-inf")
        self._late_said = False
        self.max_late_s = 0.0
        self._write_error = ""

    # --- reading: never waits on anything but the pipe ------------------------------------------

    def read_all(self) -> None:
        while True:
            try:
                data = os.read(self.src, READ_BYTES)
            except InterruptedError:
                continue
            except OSError:
                data = b""
            now = self.mono()
            with self._cond:
                if not data:
                    self._eof = True
                    self._cond.notify()
                    return
                self._chunks.append((now, data))
                self._size += len(data)
                while self._size > self.buffer_bytes and len(self._chunks) > 1:
                    _, old = self._chunks.popleft()
                    self._size -= len(old)
                    self._dropped("late", len(old))
                self._cond.notify()

    def _dropped(self, why: str, n: int) -> None:
        if self._first_drop_t is None:
            self._first_drop_t = self.clock()
        if why == "late":
            self.dropped_late += n
        else:
            self.dropped_full += n

    # --- writing: as fast as the disk goes --------------------------------------------------------

    def write_all(self) -> None:
        while True:
            with self._cond:
                if not self._chunks and not self._eof:
                    self._cond.wait(NOTE_EVERY_S)
                chunks = list(self._chunks)
                self._chunks.clear()
                self._size = 0
                eof = self._eof and not chunks
            if eof:
                self._note(final=True)
                return
            if not chunks:  # a quiet while: a drop not yet said is said now (no I/O under the lock)
                self._note(final=False)
                continue
            oldest = chunks[0][0]
            self._write(b"".join(c for _, c in chunks))
            late = self.mono() - oldest
            self.max_late_s = max(self.max_late_s, late)
            self._late(late)
            self._note(final=False)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.dst, view)
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno not in rundir.DISK_FULL_ERRNOS and not self._write_error:
                    self._write_error = e.strerror or str(e)
                with self._cond:
                    self._dropped("full", len(view))
                return
            view = view[n:]

    def _late(self, late: float) -> None:
        if late >= LATE_S and not self._late_said:
            self._late_said = True
            self._event("warning", protocol.OUTPUT_SOURCE, f"{LATE_MESSAGE} ({late:.1f} s behind): the run directory's disk "
                        f"is slow; training does not wait for it (up to {self.buffer_bytes >> 20} MiB is held, "
                        "then the oldest is dropped)")
        elif late < LATE_S / 4:
            self._late_said = False  # caught up: a new episode is said again

    def _note(self, final: bool) -> None:
        with self._cond:
            late = self.dropped_late - self._reported_late
            full = self.dropped_full - self._reported_full
            since = self._first_drop_t
        if not (late or full) or (not final and self.mono() - self._last_note < NOTE_EVERY_S):
            return
        self._last_note = self.mono()
        self._reported_late += late
        self._reported_full += full
        span = f" from {time.strftime('%H:%M:%S', time.localtime(since))}" if since else ""
        parts = []
        if late:
            parts.append(f"the run directory's disk fell {self.buffer_bytes >> 20} MiB behind{span}: dropped "
                         f"{late:,} bytes of the script's output")
        if full:
            why = f"could not be written ({self._write_error})" if self._write_error else "was full"
            parts.append(f"the disk {why}{span}: lost {full:,} bytes of the script's output")
        self._event("warning", protocol.DISK_FULL_SOURCE, "; ".join(parts) + "; training went on")
        with self._cond:
            self._first_drop_t = None

    def _event(self, level: str, source: str, message: str) -> None:
        if self.events is None:
            return
        line = protocol.encode(protocol.Event(t=self.clock(), level=level, source=source,  # type: ignore[arg-type]
                                              message=message))
        try:  # one whole line per append: the agent appends to the same file
            fd = os.open(self.events, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        except OSError:
            return  # no recording (yet, or gone): the next note says it all again
        try:
            os.write(fd, line)
        except OSError:
            pass  # a full disk: this note is lost like the output it counts
        finally:
            os.close(fd)

    def run(self) -> None:
        """Until every writer has closed the pipe and the buffer is written."""
        writer = threading.Thread(target=self.write_all, name="output-writer")
        writer.start()
        self.read_all()
        writer.join()


def main(argv: list[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    events = Path(argv[0]) / rundir.EVENTS if argv else None
    Pump(0, 1, events).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The agent's recording: whole lines appended to ``events.jsonl`` from the agent's thread.

What a full disk, a script that closes or reuses the recording's descriptor, or a file system
that went away does to the recording is decided here; the agent's drain hands it encoded lines.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable

from tpuwatch import protocol, rundir
from tpuwatch.agent.agent_api import OutputLoss, high_fd
from tpuwatch.protocol import Event, Message


class RecordingWriter:
    """Appends whole lines to the run's ``events.jsonl``. ``disabled``: the agent's disabled
    probes (shared: "recording" in it stops the writes); ``requeue``: puts a message at the head
    of the agent's buffer (the note that the descriptor was reused)."""

    def __init__(self, run_dir: Path, clock: Callable[[], float], disabled: dict[str, str],
                 requeue: Callable[[Message], None]) -> None:
        self.run_dir = run_dir
        self.clock = clock
        self._disabled = disabled
        self._requeue = requeue
        self.events_path = run_dir / rundir.EVENTS
        # Whole lines per write(2) with O_APPEND: the launcher appends findings to the same file,
        # and appends of whole lines never interleave mid-line.
        # Never through a planted link, nor into a file that is not this user's own (rundir); on a
        # high descriptor, so a script that closes and reopens low ones never gets the stream.
        self.fd = high_fd(rundir.open_append(self.events_path))
        self._fd_identity = _identity(self.fd)
        # Full-disk accounting (see write): what was dropped since the last note.
        self._cut = False
        self._lost_messages = 0
        self._lost_bytes = 0
        self._disk_full_since: float | None = None
        self._output_lost_reported = 0
        self._output_seen = 0
        self.output_guard: OutputLoss | None = None  # set by guards.install (through the agent)

    def write(self, data: bytes, final: bool = False) -> None:
        """Appends whole lines. On a full disk the lines are dropped and counted (never retried
        from memory: the training must not grow); the next write that fits starts with a note of
        what was lost. ``final``: the exit record is in ``data``, so the run directory's disk
        reserve is given up for it if that is what it takes."""
        if "recording" in self._disabled:
            return
        note = self._loss_note(final)
        if note:
            data = note + data
        written = self._write_all(data)
        if written < 0 and final and rundir.release_reserve(self.run_dir):
            written = self._write_all(data)
        if written >= 0:
            self._disk_full_since = None
            self._lost_messages = self._lost_bytes = 0
            if note:
                self._output_lost_reported = self._output_seen
            return
        lost = data.count(b"\n") - (note.count(b"\n") if note else 0)
        self._lost_messages += lost
        self._lost_bytes += len(data) - len(note)
        if self._disk_full_since is None:
            self._disk_full_since = self.clock()

    def close(self) -> None:
        """Closes the descriptor (a forked child's, the end of the run); writes after it fail."""
        try:
            os.close(self.fd)
        except OSError:
            pass

    def detach(self) -> None:
        """In a forked child: the descriptor is the parent's; closed, and never written again."""
        self.close()
        self.fd = -1

    def _check_fd(self) -> None:
        """A script can close the recording's descriptor and open its own file on the same number
        (``os.closerange``, ``dup2``): before each write (a batch, on the agent's thread, one
        ``fstat``) the descriptor must still be the file the agent opened; if not, it is left to
        the script and the recording is opened again."""
        if _identity(self.fd) == self._fd_identity:
            return
        old = self.fd
        try:
            self.fd = high_fd(rundir.open_append(self.events_path, create=False))
        except OSError as e:
            self.fd = -1
            self._disabled["recording"] = str(e)
            return
        self._fd_identity = _identity(self.fd)
        self._cut = False  # the cut line, if any, is not ours to end any more
        self._requeue(Event(t=self.clock(), level="warning", source="agent",
                            message=f"the script closed or reused the recording's descriptor {old}; "
                                    "tpuwatch opened events.jsonl again (nothing was written into the "
                                    "script's file)"))

    def _write_all(self, data: bytes) -> int:
        """Writes ``data``; the byte count, or -1 when the disk is full. A write the disk cut
        short is taken back (truncated off) so the recording never holds half a line; if even
        that fails, the next write first ends the cut line."""
        self._check_fd()
        if "recording" in self._disabled:
            return 0
        if self._cut:
            data = b"\n" + data
        view = memoryview(data)
        written = 0
        try:
            while view:
                n = os.write(self.fd, view)
                view = view[n:]
                written += n
        except OSError as e:
            if e.errno in rundir.DISK_FULL_ERRNOS:
                if written:
                    try:  # O_APPEND: our bytes are the file's last ones (the file is as before)
                        os.ftruncate(self.fd, os.fstat(self.fd).st_size - written)
                    except OSError:
                        self._cut = True
                return -1
            # Anything else (the file system gone, ...): say so once on stderr and stop recording.
            self._disabled["recording"] = str(e)
            print(f"tpuwatch: cannot write {self.events_path}: {e}; the recording stops here", file=sys.stderr)
            return 0
        self._cut = False
        return len(data)

    def _output_guard_lost(self) -> int:
        guard = self.output_guard
        return guard.dropped_bytes if guard is not None else 0

    def _loss_note(self, final: bool) -> bytes:
        """The event saying what a full disk made the run lose since the last note ("" if nothing).
        Output still being dropped waits for the next note (one note per full-disk episode, not
        one per write), unless this is the last write."""
        total = self._output_guard_lost()
        settling, self._output_seen = total != self._output_seen, total
        output = total - self._output_lost_reported
        if settling and not final and not self._lost_messages:
            output = 0
        if not self._lost_messages and not output:
            return b""
        since = self._disk_full_since
        if since is None and self.output_guard is not None:
            since = self.output_guard.first_drop_t
        parts = []
        if self._lost_messages:
            parts.append(f"{self._lost_messages:,} recorded message(s) ({self._lost_bytes:,} bytes)")
        if output:
            parts.append(f"{output:,} bytes of the script's output")
        span = f" from {time.strftime('%H:%M:%S', time.localtime(since))}" if since else ""
        return protocol.encode(Event(
            t=self.clock(), level="warning", source=protocol.DISK_FULL_SOURCE,
            message=f"the disk was full{span}: lost {' and '.join(parts)}; training went on"))


def _identity(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino

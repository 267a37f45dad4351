"""A source that tails a run directory's events.jsonl (``tpuwatch run`` and local attach)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping, Sequence

from tpuwatch import rundir
from tpuwatch.monitor.recording import ReadStats, RecordingReader
from tpuwatch.protocol import Command, Message
from tpuwatch.sources.source import Tagged, WorkerHealth


class FileSource:
    """Tails ``events.jsonl`` with a ``RecordingReader``; commands go through ``send``.

    ``send`` is the lead's command sender (socket to the agent); without one, profile and
    checkpoint stay disabled in the dashboard.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        send: Callable[[Command], None] | None = None,
        live: bool = True,
        reader: RecordingReader | None = None,
    ) -> None:
        if reader is None:
            reader = RecordingReader(Path(run_dir) / rundir.EVENTS)
        self._reader = reader
        self._send = send
        self.run_dir = Path(run_dir)
        self.live = live
        self.can_send = send is not None

    def poll(self) -> Sequence[Message]:
        # Small reads: the app checks its time budget between polls, so catching up on a long
        # recording never freezes the screen for more than a fraction of a second.
        return self._reader.read_new(max_bytes=POLL_BYTES)

    def poll_tagged(self) -> list[Tagged]:
        # One run: its messages untagged (the worker comes from its Hello).
        return [(None, m) for m in self.poll()]

    def health(self) -> Mapping[str, WorkerHealth]:
        return {}

    @property
    def caught_up(self) -> bool:
        return self._reader.caught_up

    def finish(self) -> list[Tagged]:
        return [(None, m) for m in self._reader.finish()]

    def send(self, command: Command) -> None:
        if self._send is None:
            raise OSError("this viewer cannot send commands to the run")
        self._send(command)

    def now(self) -> float | None:
        return None

    def read_stats(self) -> ReadStats:
        """The reader's count of unreadable lines."""
        return self._reader.stats

    def close(self) -> None:
        pass  # the reader opens the recording for each read: nothing stays open


POLL_BYTES = 256 << 10


def make_file_source(
    run_dir: Path, *, send: Callable[[Command], None] | None = None, live: bool = True
) -> FileSource:
    """The source ``tpuwatch run`` and ``tpuwatch attach`` (same host) give the dashboard."""
    return FileSource(Path(run_dir), send=send, live=live)

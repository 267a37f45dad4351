"""Follows the script's output.log: new complete lines since the last call, cleaned for display.

Not a widget: the dashboard asks for new lines at its refresh rate and appends them to its log
view. Keras progress bars (``\\r`` redraws) keep only their final state; ANSI colour and cursor
codes (CSI sequences) are removed (the log view draws plain text); every other control
character, the rest of an escape sequence included (``ESC c``, ``ESC 7``, OSC 0/52, 8-bit C1),
is shown escaped (:func:`~tpuwatch.printable.printable`), never sent to the terminal.
"""

from __future__ import annotations

import codecs
import os
import re
from pathlib import Path

from tpuwatch import rundir
from tpuwatch.printable import printable

_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
#: When attaching to a long run, start this many bytes before the end instead of at byte 0.
DEFAULT_START_BYTES = 1 << 20
#: Cap per call, so a burst of output never stalls a refresh.
DEFAULT_MAX_BYTES_PER_READ = 1 << 20


def clean_line(raw: str) -> str:
    """One display line from one raw line: last ``\\r`` segment, no colour codes, any other
    control character escaped."""
    if "\r" in raw:
        segments = [s for s in raw.split("\r") if s]
        raw = segments[-1] if segments else ""
    return printable(_CSI.sub("", raw), keep="\t")


class OutputTail:
    """Reads ``path`` incrementally. A missing file reads as nothing (the run may not have
    written yet); a file that shrank (rotated, truncated) is read again from its start."""

    def __init__(
        self,
        path: Path,
        *,
        start_bytes: int = DEFAULT_START_BYTES,
        max_bytes_per_read: int = DEFAULT_MAX_BYTES_PER_READ,
    ) -> None:
        self.path = Path(path)
        self._start_bytes = start_bytes
        self._max = max_bytes_per_read
        self._offset: int | None = None  # None until the file is first seen
        self._skip_partial_first = False
        self._pending = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    @property
    def offset(self) -> int:
        return self._offset or 0

    def read_lines(self) -> list[str]:
        try:
            with rundir.open_regular(self.path) as f:
                size = os.fstat(f.fileno()).st_size
                if self._offset is None:
                    self._offset = max(0, size - self._start_bytes)
                    self._skip_partial_first = self._offset > 0
                elif size < self._offset:
                    self._offset = 0
                    self._pending = ""
                    self._decoder.reset()
                if size == self._offset:
                    return []
                f.seek(self._offset)
                data = f.read(min(self._max, size - self._offset))
        except (FileNotFoundError, rundir.NotRegularFile):  # not yet there; a FIFO is never read
            return []
        self._offset += len(data)
        text = self._pending + self._decoder.decode(data)
        parts = text.split("\n")
        self._pending = parts.pop()
        if self._skip_partial_first and parts:
            parts.pop(0)  # we started mid-line
            self._skip_partial_first = False
        return [clean_line(p) for p in parts]

    def flush(self) -> list[str]:
        """The unfinished last line, once the run is over (it will get no newline)."""
        rest = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return [clean_line(rest)] if rest else []

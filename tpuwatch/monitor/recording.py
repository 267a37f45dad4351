"""Reading a recording (``events.jsonl``): incrementally while the run writes it, or whole.

The agent appends one JSON line per message and flushes at least once a second, so a reader can
see a line that is not finished yet. :class:`RecordingReader` keeps such a partial tail back until
its newline arrives; only when the run is over (:meth:`RecordingReader.finish`) is a tail without a
newline reported as cut (``truncated_tail``), with the number of bytes dropped.

Decoding never raises: malformed lines and unknown kinds are counted (:class:`protocol.Decoder`).
``step`` lines, which are nearly all of a long recording, take a fast path
(:func:`protocol.decode_step_line`) that builds the :class:`~tpuwatch.protocol.Step` directly from
the decoded object and falls back to the full, validating decoder for anything unusual (non-finite
values, odd types, missing fields).
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from tpuwatch import protocol, rundir
from tpuwatch.protocol import Message

#: Default cap on bytes read per :meth:`RecordingReader.read_new` call, so a UI catching up on a
#: huge recording stays responsive: ~8 MiB is ~30,000 step lines, ~0.3 s of decoding.
DEFAULT_MAX_BYTES_PER_READ = 8 << 20


@dataclass(frozen=True)
class ReadStats:
    """What reading a recording found. Byte counts are of the file."""

    messages: int = 0
    malformed: int = 0
    unknown: int = 0
    bytes_read: int = 0
    truncated_tail: bool = False  # the recording ends in a line without its newline
    dropped_bytes: int = 0  # bytes of that cut line (plus any over-long lines skipped)
    last_error: str = ""


class RecordingReader:
    """Reads new complete lines of a recording each call, remembering its byte offset.

    ``read_new()`` returns the messages decoded from at most ``max_bytes_per_read`` new bytes
    (whole lines only; a line longer than the cap is still read whole). A missing file reads as
    empty (the agent may not have started yet). Not thread-safe: one reader per consumer.
    """

    def __init__(self, path: str | os.PathLike[str], *,
                 max_bytes_per_read: int = DEFAULT_MAX_BYTES_PER_READ, offset: int = 0) -> None:
        if max_bytes_per_read <= 0:
            raise ValueError(f"max_bytes_per_read must be positive, got {max_bytes_per_read}")
        self.path = Path(path)
        self.max_bytes_per_read = max_bytes_per_read
        self._offset = offset  # file offset of the first byte not yet consumed (incl. _pending)
        self._pending = b""  # bytes of an unfinished last line, read but not consumed
        self._skipping = False  # inside an over-long line: drop bytes until its newline
        self._decoder = protocol.Decoder()
        self._messages = 0
        self._dropped = 0
        self._truncated = False
        self._caught_up = False
        self._finished = False

    # --- state ----------------------------------------------------------------------------------

    @property
    def offset(self) -> int:
        """Byte offset just after the last complete line consumed (where to resume)."""
        return self._offset

    @property
    def caught_up(self) -> bool:
        """True when the last read reached the end of the file as it was then."""
        return self._caught_up

    @property
    def pending_bytes(self) -> int:
        """Bytes of an unfinished last line held back."""
        return len(self._pending)

    @property
    def stats(self) -> ReadStats:
        return ReadStats(
            messages=self._messages,
            malformed=self._decoder.malformed,
            unknown=self._decoder.unknown,
            bytes_read=self._offset + len(self._pending),
            truncated_tail=self._truncated,
            dropped_bytes=self._dropped,
            last_error=self._decoder.last_error,
        )

    # --- reading ----------------------------------------------------------------------------------

    def read_new(self, max_bytes: int | None = None) -> list[Message]:
        """Messages from the lines completed since the last call (at most ~``max_bytes`` read)."""
        cap = self.max_bytes_per_read if max_bytes is None else max_bytes
        try:
            with rundir.open_regular(self.path) as f:
                start = self._offset + len(self._pending)
                size = os.fstat(f.fileno()).st_size
                if size < start:
                    # The file shrank: it is not the recording we were reading. Say so once
                    # through the decoder's error and read nothing more from the old offset.
                    self._decoder.last_error = (
                        f"{self.path} shrank from {start} to {size} bytes; stopped reading")
                    self._caught_up = True
                    return []
                f.seek(start)
                chunk = f.read(min(cap, size - start))
                # A line longer than the cap: keep reading until its newline (or EOF) so that
                # every call makes progress.
                while chunk and b"\n" not in chunk and start + len(chunk) < size and not self._skipping:
                    more = f.read(min(cap, size - start - len(chunk)))
                    if not more:
                        break
                    chunk += more
                    if len(self._pending) + len(chunk) > protocol.MAX_LINE_BYTES:
                        break
                self._caught_up = start + len(chunk) >= size
        except FileNotFoundError:
            self._caught_up = True
            return []
        except rundir.NotRegularFile as e:  # a FIFO or a device: never read (a hang, or endless)
            self._decoder.last_error = str(e.strerror)
            self._caught_up = True
            return []
        return self._consume(chunk)

    def _consume(self, chunk: bytes) -> list[Message]:
        if not chunk:
            return []
        data = self._pending + chunk
        if self._skipping:
            nl = data.find(b"\n")
            if nl < 0:
                self._dropped += len(data)
                self._offset += len(data)
                self._pending = b""
                return []
            self._dropped += nl + 1
            self._offset += nl + 1
            data = data[nl + 1:]
            self._skipping = False
        cut = data.rfind(b"\n") + 1
        body, self._pending = data[:cut], data[cut:]
        self._offset += cut
        if len(self._pending) > protocol.MAX_LINE_BYTES:
            # Never going to be a valid line: count it once and drop it up to its newline.
            self._decoder.malformed += 1
            self._decoder.last_error = f"line longer than {protocol.MAX_LINE_BYTES} bytes skipped"
            self._dropped += len(self._pending)
            self._offset += len(self._pending)
            self._pending = b""
            self._skipping = True
        return self._decode_lines(body)

    def _decode_lines(self, body: bytes) -> list[Message]:
        out: list[Message] = []
        append = out.append
        decode = self._decoder.decode
        decode_step, step_prefix = protocol.decode_step_line, protocol.STEP_LINE_PREFIX
        for line in body.split(b"\n"):
            if not line or line.isspace():
                continue
            msg: Message | None = decode_step(line) if line.startswith(step_prefix) else None
            if msg is None:
                msg = decode(line)
                if msg is None:
                    continue
            append(msg)
        self._messages += len(out)
        return out

    def finish(self) -> list[Message]:
        """Reads everything left, once the writer is gone; a tail without newline is then cut.

        Returns the last messages (a final line that lacks only its newline is still decoded);
        afterwards :attr:`stats` tells ``truncated_tail`` and ``dropped_bytes``.
        """
        out: list[Message] = []
        while True:
            got = self.read_new()
            out.extend(got)
            if self._caught_up:
                break
        if self._pending and not self._finished:
            tail = self._pending.strip()
            msg = None
            if tail:
                before = (self._decoder.malformed, self._decoder.unknown, self._decoder.last_error)
                msg = self._decoder.decode(tail)
                # A cut line is not malformed content: report it as a truncated tail instead.
                self._decoder.malformed, self._decoder.unknown, self._decoder.last_error = before
            if msg is not None:
                out.append(msg)
                self._messages += 1
            elif tail:
                self._truncated = True
                self._dropped += len(self._pending)
            self._offset += len(self._pending)
            self._pending = b""
        self._finished = True
        return out


def iter_recording(path: str | os.PathLike[str],
                   max_bytes_per_read: int = DEFAULT_MAX_BYTES_PER_READ
                   ) -> tuple[Iterator[Message], RecordingReader]:
    """Streams a finished recording without holding it in memory.

    Returns ``(messages, reader)``; once ``messages`` is exhausted, ``reader.stats`` is final.
    Use this for million-step recordings (``read_all`` keeps every message).
    """
    reader = RecordingReader(path, max_bytes_per_read=max_bytes_per_read)

    def gen() -> Iterator[Message]:
        while True:
            batch = reader.read_new()
            yield from batch
            if reader.caught_up:
                break
        yield from reader.finish()

    return gen(), reader


def read_all(path: str | os.PathLike[str]) -> tuple[list[Message], ReadStats]:
    """Every message of a finished recording, and what reading it found.

    Raises ``FileNotFoundError`` when ``path`` does not exist (a mistyped run is an error here,
    unlike while following a run that has not written yet).
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"no recording at {path}")
    it, reader = iter_recording(path)
    # A million-step recording is a million tracked objects: the cyclic collector would scan
    # them again and again while the list grows (measured 65k -> 99k lines/s without it).
    # None of them form cycles, so pausing it is safe; it is restored whatever happens.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        messages = list(it)
    finally:
        if was_enabled:
            gc.enable()
    return messages, reader.stats


def append(path: str | os.PathLike[str], messages: Iterable[Message]) -> None:
    """Appends messages to a recording in one ``O_APPEND`` write, so the lines never interleave
    with the agent's (which also writes whole lines in each write). On a full disk they are
    dropped (findings are derived: a report computes them again)."""
    data = b"".join(protocol.encode(m) for m in messages)
    fd = rundir.open_append(path, create=False)  # this user's own recording, never through a link
    try:
        os.write(fd, data)
    except OSError as e:
        if e.errno not in rundir.DISK_FULL_ERRNOS:
            raise
    finally:
        os.close(fd)


#: Bytes of a recording's end that ``tail_messages`` reads by default (``ls`` reads this much per run).
TAIL_BYTES = 64 * 1024
#: Bytes of a recording's start read to decide whether it is one.
HEAD_BYTES = 64 * 1024


def _tail_lines(path: Path, nbytes: int) -> list[bytes]:
    """The complete lines in the last ``nbytes`` of a recording (none when it cannot be read)."""
    try:
        with rundir.open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, size - nbytes)
            f.seek(start)
            data = f.read(nbytes)
    except OSError:
        return []
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the first one is (probably) cut
    return [line for line in lines if line.strip()]


def tail_messages(path: Path, nbytes: int = TAIL_BYTES) -> list[Message]:
    """Decodes the complete lines in the last ``nbytes`` of a recording."""
    dec = protocol.Decoder()
    return [m for m in map(dec.decode, _tail_lines(path, nbytes)) if m is not None]


def last_exit(path: Path, nbytes: int = TAIL_BYTES) -> protocol.Exit | None:
    """The last exit record in the recording's tail, None when it has none (the run has not
    ended, or ended without one: killed). Decodes only the exit lines, so it is cheap enough to
    ask while waiting for a run to end."""
    decoder = protocol.Decoder()
    for line in reversed(_tail_lines(path, nbytes)):
        if line.startswith(b'{"kind":"exit"'):
            msg = decoder.decode(line)
            if isinstance(msg, protocol.Exit):
                return msg
    return None


def last_step(path: Path) -> protocol.Step | None:
    """The recording's last step record, read backwards from its end a chunk at a time until one
    is found: evaluation and ``predict`` after training can write far more than a tail holds.
    Decodes only that line; a line not finished yet is left out. None when it has none."""
    marker = b'{"kind":"step",'
    decoder = protocol.Decoder()
    try:
        with rundir.open_regular(path) as f:
            end = os.fstat(f.fileno()).st_size
            carry = b""  # the rest of the line the previous chunk began inside, with its newline
            while end > 0:
                start = max(0, end - TAIL_BYTES)
                f.seek(start)
                data = f.read(end - start) + carry
                end = start
                cut = data.find(b"\n") + 1 if start > 0 else 0
                if start > 0 and cut == 0:
                    carry = data if len(data) <= protocol.MAX_LINE_BYTES else b""
                    continue
                carry, body = data[:cut], data[cut:]
                pos = len(body)
                while (pos := body.rfind(marker, 0, pos)) >= 0:
                    line_end = body.find(b"\n", pos)
                    if (pos == 0 or body[pos - 1:pos] == b"\n") and line_end >= 0:
                        msg = decoder.decode(body[pos:line_end + 1])
                        if isinstance(msg, protocol.Step):
                            return msg
    except OSError:
        return None
    return None


def first_message(path: Path) -> Message | None:
    """The recording's first message (a run's ``Hello``) if its first line is complete and one."""
    try:
        with rundir.open_regular(path) as f:
            line = f.readline(protocol.MAX_LINE_BYTES)
    except OSError:
        return None
    return protocol.Decoder().decode(line) if line.endswith(b"\n") else None


def recording_problem(run_dir: Path, *, missing_ok: bool = False) -> str:
    """One line saying why ``run_dir`` holds no recording that can be read; "" when it does, when
    it is empty or its first line is still being written (a run that has just started), and, with
    ``missing_ok``, when it has none (``report`` reports a run from its run.json alone).

    A recording is a file whose first :data:`HEAD_BYTES` hold at least one tpuwatch message: a
    line that cannot be decoded is skipped and counted in the rest of a recording, so one at its
    start (a stray write) does not make the file foreign."""
    path = run_dir / rundir.EVENTS
    meta = rundir.meta_problem(run_dir)
    if meta:
        return meta
    if path.is_dir():  # not "remove it", as for a FIFO or a device: it may hold someone's files
        return f"{path} is not a file; a recording is a file of JSON lines"
    try:
        with rundir.open_regular(path) as f:
            head = f.read(HEAD_BYTES)
    except FileNotFoundError:
        if missing_ok:
            return ""
        return f"{run_dir} holds no recording ({rundir.EVENTS} is missing): is it a tpuwatch run directory?"
    except rundir.NotRegularFile as e:
        return str(e.strerror)
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}"
    # The part after the last newline is a line not finished yet, or one cut by the read.
    lines = [line for line in head.split(b"\n")[:-1] if line.strip()]
    if not lines:
        return ""
    decoder = protocol.Decoder()
    if any(decoder.decode(line) is not None for line in lines):
        return ""
    return (f"{path} is not a tpuwatch recording: none of its first {len(lines)} line(s) is a tpuwatch "
            f"message ({decoder.last_error or 'unknown kinds'})")

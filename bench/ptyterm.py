"""A program in a pseudo-terminal of a fixed size, its output drained and counted.

Shared by bench/terminal_bytes.py and bench/startup.py: a real terminal (a pty with a window
size, ``TERM=xterm-256color``, the pty as the controlling terminal of a new session) so that the
dashboard, htop and top write the frames they would write to a user's terminal. A thread reads
the pty's master side as fast as it can and records (time, bytes) of every read; the first time
a given text appears in the output is noted too (the first frame).
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import subprocess
import termios
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence


@dataclass
class PtyProgram:
    """``argv`` running in a ``cols`` x ``rows`` pty; ``wait_for`` is text whose first appearance
    in the output is timed (from spawn) into ``found_at``."""

    argv: Sequence[str]
    cols: int = 120
    rows: int = 40
    env: dict[str, str] | None = None
    cwd: str | None = None
    wait_for: bytes | None = None
    keep_output: bool = False  # keep every byte in ``output`` (analysis of what is redrawn)
    output: bytearray = field(default_factory=bytearray)
    reads: list[tuple[float, int]] = field(default_factory=list)  # (perf_counter, bytes)
    found_at: float | None = None
    spawned_at: float = 0.0

    def start(self) -> "PtyProgram":
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", self.rows, self.cols, 0, 0))
        env = dict(os.environ if self.env is None else self.env)
        env.update(TERM="xterm-256color", COLUMNS=str(self.cols), LINES=str(self.rows))

        def controlling_tty() -> None:  # runs after setsid(): the pty becomes this session's tty
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.spawned_at = time.perf_counter()
        self.proc = subprocess.Popen(list(self.argv), stdin=slave, stdout=slave, stderr=slave, env=env,
                                     cwd=self.cwd, start_new_session=True, preexec_fn=controlling_tty,
                                     close_fds=True)
        os.close(slave)
        self._master = master
        self._tail = b""
        self._thread = threading.Thread(target=self._drain, name="pty-drain", daemon=True)
        self._thread.start()
        return self

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self._master, 1 << 16)
            except OSError:  # EIO: every process holding the slave side has gone
                return
            if not data:
                return
            now = time.perf_counter()
            self.reads.append((now, len(data)))
            if self.keep_output:
                self.output += data
            if self.wait_for is not None and self.found_at is None:
                # Keep only enough of the previous read to catch the text across two reads.
                window = self._tail + data
                if self.wait_for in window:
                    self.found_at = now - self.spawned_at
                self._tail = window[-len(self.wait_for):]

    def bytes_between(self, t0: float, t1: float) -> int:
        return sum(n for t, n in list(self.reads) if t0 <= t < t1)

    def send(self, data: bytes) -> None:
        os.write(self._master, data)

    def stop(self, keys: bytes | None = None, timeout: float = 5.0) -> int | None:
        """Ends the program: ``keys`` first (its own quit key), then SIGTERM, then SIGKILL."""
        if keys and self.proc.poll() is None:
            try:
                self.send(keys)
                self.proc.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                continue
        try:
            os.close(self._master)
        except OSError:
            pass
        self._thread.join(1.0)
        return self.proc.returncode

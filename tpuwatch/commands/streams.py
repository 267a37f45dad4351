"""Guards for tpuwatch's own stdout and stderr when their reader goes away (`| head`, a closed
terminal), and the copier that passes the script's output.log on to stdout."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable


def quiet_stdout() -> None:
    """Points stdout at /dev/null, so that the interpreter's final flush into a closed pipe
    cannot raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


class Unbreakable:
    """A text stream whose writes and flushes never raise (the reader has gone: drop the text)."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                self._stream.write(text)
            except (OSError, ValueError):
                self.broken = True
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self.broken = True

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def start_copier(path: Path) -> tuple[threading.Event, threading.Thread]:
    """Copies the script's output to our stdout until the returned event is set."""
    done = threading.Event()
    copier = threading.Thread(target=_copy_output, args=(path, done), daemon=True)
    copier.start()
    return done, copier


def _copy_output(path: Path, done: threading.Event) -> None:
    """Copies the script's output.log to our stdout as it grows (the script's output still reaches the user)."""
    out = sys.stdout.buffer
    with open(path, "rb") as f:
        while True:
            chunk = f.read(65536)
            if chunk:
                try:
                    out.write(chunk)
                    out.flush()
                except (BrokenPipeError, ValueError):
                    quiet_stdout()  # else the interpreter's last flush fails too (exit 120)
                    return
                continue
            if done.is_set():
                return
            time.sleep(0.1)


def sleep_watching_stdout() -> Callable[[float], None]:
    """``time.sleep`` that ends with BrokenPipeError once stdout's reader has gone (`| head`):
    a quiet run writes nothing for a long time, and the pipeline would wait for it. A pipe's
    writer sees POLLERR when its last reader closes; a file or a terminal never does."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLERR)
    except (AttributeError, OSError, ValueError):
        return time.sleep

    def sleep(seconds: float) -> None:
        if poller.poll(max(0, int(seconds * 1000))):
            raise BrokenPipeError("stdout's reader has gone")

    return sleep

"""A terminal driver that survives its terminal going away (closed window, dropped SSH link).

When the pty closes, every write to it fails with EIO. Textual's output thread
(``textual.drivers._writer_thread.WriterThread``) does not catch that: it dies on the first
failed write, its bounded queue (30 writes) fills with frames, and the next write blocks the
app's main thread for ever, so the dashboard never gets to handle the SIGHUP as a detach and the
``tpuwatch run`` process hangs (seen for real: ``tests/robustness/test_detach.py``, py-spy showed
the main thread in ``Queue.put`` under ``App._shutdown``).

The fix wraps the file the driver writes to: once a write or flush fails with ``OSError`` the
terminal is taken as gone and later output is dropped, so shutdown completes.
"""

from __future__ import annotations

from typing import IO, Any

from textual.driver import Driver


class TerminalFile:
    """Delegates to ``file``; after the first ``OSError`` from it, writes are dropped."""

    def __init__(self, file: IO[str]) -> None:
        self._file = file
        self.gone = False
        self.error = ""

    def _lost(self, e: OSError) -> None:
        self.gone = True
        self.error = f"{type(e).__name__}: {e}"

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self._file.write(text)
            except OSError as e:  # EIO / EPIPE: the terminal went away
                self._lost(e)
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._file.flush()
            except OSError as e:
                self._lost(e)

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, ...
        return getattr(self._file, name)


def hangup_safe(driver_class: type[Driver]) -> type[Driver]:
    """``driver_class`` with its output file wrapped in :class:`TerminalFile` (when it has one:
    the Linux driver's ``_file``; other drivers are returned unchanged)."""
    if not hasattr(driver_class, "_disable_mouse_support"):  # not a terminal driver
        return driver_class

    class HangupSafeDriver(driver_class):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            file = getattr(self, "_file", None)
            if file is not None and not isinstance(file, TerminalFile):
                self._file = TerminalFile(file)

    HangupSafeDriver.__name__ = f"HangupSafe{driver_class.__name__}"
    HangupSafeDriver.__qualname__ = HangupSafeDriver.__name__
    return HangupSafeDriver

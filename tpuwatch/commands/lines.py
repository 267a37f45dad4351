"""tpuwatch's own one-line messages on stderr: a usage error (exit 2) or a status line."""

from __future__ import annotations

import sys

from tpuwatch.printable import printable

EXIT_USAGE = 2


def error(message: str) -> int:
    """Prints ``tpuwatch: MESSAGE`` on stderr; returns the usage exit code."""
    print(f"tpuwatch: {printable(message)}", file=sys.stderr)  # it may quote a run's id or path
    return EXIT_USAGE


def say(line: str) -> None:
    """A status line on stderr; a closed terminal (hangup) is not an error worth a traceback."""
    try:
        print(f"tpuwatch: {printable(line)}", file=sys.stderr, flush=True)
    except OSError:
        pass


def bad_every(every: float) -> int | None:
    """The usage error for an --every that is not a positive, finite number (NaN too), else None."""
    if 0 < every < float("inf"):
        return None
    return error(f"--every {every:g}: give a positive number of seconds between progress lines")

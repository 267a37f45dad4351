"""The process's RSS and CPU and the host's memory, read on the agent thread at the sample rate.

psutil's calls for one host sample (RSS, CPU percent, available and total memory) cost ~120 µs
on this project's 2-core box: each opens, reads and parses a /proc file, behind layers of
wrappers. On Linux this reads the same files through descriptors opened once (``pread``: no
open or close per sample) and the process's CPU from ``os.times()``: ~10 µs a sample. Elsewhere
(no /proc) psutil answers, as before.

The figures are psutil's: RSS is ``/proc/self/statm``'s resident pages times the page size;
available and total memory are ``/proc/meminfo``'s ``MemAvailable`` and ``MemTotal``; the CPU
percent is the process's user and system time over the wall time since the previous call
(100 is one core). A forked child opens its own files (``/proc/self`` names the process that
opened it).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from tpuwatch.agent.agent_api import high_fd

_STATM = "/proc/self/statm"
_MEMINFO = "/proc/meminfo"
_READ = 8192


class _Fd:
    """A /proc file kept open by this process (reopened after a fork)."""

    __slots__ = ("path", "fd", "pid")

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1
        self.pid = -1

    def read(self) -> bytes:
        pid = os.getpid()
        if self.pid != pid:
            # A forked child's copy names its parent's /proc entry: open this process's own
            # (closing the child's copy leaves the parent's open). High and close-on-exec, as
            # every descriptor the agent keeps: a script that closes low descriptors and opens
            # its own there never has the agent read its file.
            self.close()
            self.fd = high_fd(os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
            self.pid = pid
        return os.pread(self.fd, _READ, 0)

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1


class ProcStats:
    """``rss()``, ``cpu_percent()``, ``host_memory()`` from /proc (see the module's docstring)."""

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._statm = _Fd(_STATM)
        self._meminfo = _Fd(_MEMINFO)
        self._cpu_last: tuple[float, float] | None = None
        try:  # fails here (no /proc), not per sample
            self.rss()
            self.host_memory()
        except BaseException:
            self._statm.close()
            self._meminfo.close()
            raise

    def rss(self) -> int:
        return int(self._statm.read().split(None, 2)[1]) * self._page

    def cpu_percent(self) -> float:
        """The process's CPU since the previous call, in percent of one core (0.0 the first time)."""
        t = os.times()
        now, cpu = time.monotonic(), t.user + t.system
        last, self._cpu_last = self._cpu_last, (now, cpu)
        if last is None or now <= last[0]:
            return 0.0
        return round(max(0.0, cpu - last[1]) / (now - last[0]) * 100.0, 1)

    def host_memory(self) -> tuple[int, int]:
        """``(available, total)`` bytes of the host's memory."""
        available = total = -1
        for line in self._meminfo.read().splitlines():
            if line.startswith(b"MemTotal:"):
                total = int(line.split()[1]) * 1024
            elif line.startswith(b"MemAvailable:"):
                available = int(line.split()[1]) * 1024
            if available >= 0 and total >= 0:
                return available, total
        raise OSError(f"{_MEMINFO} has no MemAvailable (a kernel older than 3.14)")


def proc_stats() -> ProcStats | None:
    """A reader where /proc has what it needs (Linux), else ``None``."""
    try:
        return ProcStats()
    except (OSError, ValueError, AttributeError, IndexError):
        return None


def rss_reader() -> Callable[[], int] | None:
    """This process's RSS in bytes, read cheaply where /proc allows, else ``None``."""
    stats: Any = proc_stats()
    return stats.rss if stats is not None else None

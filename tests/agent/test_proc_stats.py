"""The agent's /proc reader (host samples, the leak doctor's RSS) gives psutil's figures: this
process's RSS, the host's available and total memory, the process's CPU over the time since the
last call; and a forked child reads its own RSS, not its parent's. Linux only (elsewhere psutil
answers and the reader is None)."""

from __future__ import annotations

import mmap
import os
import sys
import time

import psutil
import pytest

from tpuwatch.agent import proc_stats

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


def _fresh_pages(size: int) -> mmap.mmap:
    """``size`` bytes of memory this process never had, every page written: RSS grows by it.
    Not a Python object: malloc may hand a large one memory that earlier tests freed and that is
    still resident (the oldest-pair lane saw RSS unchanged after 200 MiB of bytes)."""
    block = mmap.mmap(-1, size)
    page = mmap.PAGESIZE
    for offset in range(0, size, page):
        block[offset] = 1
    return block


def test_figures_equal_psutils():
    stats = proc_stats.proc_stats()
    assert stats is not None
    me = psutil.Process()
    assert abs(stats.rss() - me.memory_info().rss) <= 4 << 20
    available, total = stats.host_memory()
    vm = psutil.virtual_memory()
    assert total == vm.total
    assert abs(available - vm.available) <= 256 << 20  # other processes move it between the two reads


def test_rss_follows_an_allocation():
    stats = proc_stats.proc_stats()
    before = stats.rss()
    block = _fresh_pages(200 << 20)
    try:
        assert stats.rss() - before >= 190 << 20
    finally:
        block.close()


def test_cpu_percent_is_the_time_since_the_last_call():
    stats = proc_stats.proc_stats()
    assert stats.cpu_percent() == 0.0  # the first call only starts the measure, as psutil's
    t0 = time.thread_time()
    end = time.monotonic() + 0.4
    while time.monotonic() < end:
        pass
    spun = time.thread_time() - t0
    busy = stats.cpu_percent()
    # The spin's own CPU over the 0.4 s is a floor (the box may preempt it); other threads add little.
    assert spun / 0.4 * 100 - 10 <= busy <= 100 * (os.cpu_count() or 1)
    time.sleep(0.3)
    assert stats.cpu_percent() < 50.0  # sleeping: the other threads of a test process, no spin


def test_a_forked_child_reads_its_own_rss():
    stats = proc_stats.proc_stats()
    parent = stats.rss()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: grows by 300 MiB, reports what the reader says before and after
        try:
            start = stats.rss()
            block = _fresh_pages(300 << 20)
            os.write(w, f"{start} {stats.rss()}".encode())
            block.close()
        finally:
            os._exit(0)
    os.close(w)
    try:
        start, grown = map(int, os.read(r, 64).split())
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    # The child's own figure moved with its 300 MiB (its parent's, which a stale descriptor reads,
    # did not). The child's start is its own too: a forked child's RSS is not its parent's, since
    # fork copies no page-table entries of the parent's file mappings (TF's libraries).
    assert grown - start >= 250 << 20
    assert stats.rss() - parent < 100 << 20  # the parent's own, without them


def test_a_script_that_closes_low_descriptors_and_reuses_them_leaves_the_reader_right(tmp_path):
    # The reader keeps its /proc files open on high descriptors: a script that closes 3..255 and
    # opens its own files there never has the agent pread one of them.
    import subprocess
    import textwrap

    code = textwrap.dedent(f"""
        import os, psutil
        from tpuwatch.agent import proc_stats
        stats = proc_stats.proc_stats()
        os.closerange(3, 256)
        mine = [os.open({str(tmp_path / 'f')!r}, os.O_RDWR | os.O_CREAT) for _ in range(8)]
        for fd in mine:
            os.write(fd, b"9 9 9 9 9 9 9\\n" * 100)
        rss, real = stats.rss(), psutil.Process().memory_info().rss
        available, total = stats.host_memory()
        assert abs(rss - real) <= 4 << 20, (rss, real)
        assert total == psutil.virtual_memory().total, total
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]

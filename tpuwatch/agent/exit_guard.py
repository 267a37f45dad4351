"""The end of the job: the interpreter's exit work that matters, then a bounded teardown.

TensorFlow can take from seconds to minutes, or hang, destroying live distributed iterators while
the interpreter finalizes (``MultiDeviceIterator`` -> ``RootDataset::Iterator`` destructor waiting
on a thread pool; it happens without tpuwatch too). A training job must end when its script ends,
so once the script's code has returned:

1. :func:`finish_python` does what the interpreter does first at exit, in its order: waits for
   the script's non-daemon threads (``threading._shutdown``), runs the ``atexit`` handlers, and
   flushes every open Python file — nothing a user relies on is skipped;
2. the agent records the exit and flushes the recording;
3. :func:`arm` starts a native timer (POSIX ``timer_create`` with a thread notification that calls
   ``_exit(code)``): if finalization has not ended the process within ``bound_s`` seconds, the
   process ends with the script's own exit code. A second timer (faulthandler, one second earlier)
   writes every thread's Python stack to ``teardown-stacks.txt`` in the run directory, so a
   teardown that was cut short says where it hung (the file is opened before, as nothing can be
   opened once teardown hangs; ``tpuwatch run`` removes it when it stayed empty). Both run outside the interpreter, which is
   what makes them work while it finalizes.

``TPUWATCH_TEARDOWN_S`` sets the bound (default 10 s; 0 turns the guard off).
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import faulthandler
import gc
import io
import os
import sys
import threading
from pathlib import Path
from typing import IO, Any

from tpuwatch.agent import heap
from tpuwatch.rundir import TEARDOWN_STACKS as STACKS_FILE

DEFAULT_BOUND_S = 10.0

_CLOCK_MONOTONIC = 1
_SIGEV_THREAD = 2

_keep: list[Any] = []  # what the native timers use must outlive every Python object


def bound_s() -> float:
    from tpuwatch import settings

    raw = settings.TEARDOWN_S.get().strip()
    if not raw:
        return DEFAULT_BOUND_S
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_BOUND_S
    return value if value >= 0 else DEFAULT_BOUND_S


def finish_python() -> None:
    """Non-daemon threads, atexit handlers and file buffers, as at interpreter exit (never raises
    but KeyboardInterrupt, which the caller treats as the user's interrupt)."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()  # idempotent: the interpreter's own call later returns at once
    else:  # pragma: no cover - every CPython we support has it
        for t in threading.enumerate():
            if t is not threading.main_thread() and not t.daemon:
                t.join()
    atexit._run_exitfuncs()  # runs each handler once and clears them, as at exit
    flush_open_files()


def flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        _flush(stream)


def flush_open_files() -> None:
    """Flushes every open Python file object (what finalization would do as it closes them)."""
    flush_std()
    try:
        # another thread may be building a tuple: no other thread runs while the heap is walked
        # (tpuwatch.agent.heap); the files are flushed after it
        with heap.alone():
            objects = gc.get_objects()
            files = [o for o in objects if isinstance(o, (io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper))]
            del objects
    except Exception:  # at exit, with memory short (MemoryError): finalization flushes them as it can
        return
    for obj in files:
        _flush(obj)


def _flush(stream: IO[Any] | None) -> None:
    try:
        if stream is not None and not stream.closed:
            stream.flush()
    except Exception:  # a broken pipe or a closed descriptor: nothing to save there
        pass


class _Sigevent(ctypes.Structure):
    # struct sigevent on Linux (glibc and musl agree on this layout): sigval, signo, notify, then
    # a union whose SIGEV_THREAD member is (function, attributes), padded to 64 bytes in all.
    _fields_ = [
        ("sigev_value", ctypes.c_void_p),
        ("sigev_signo", ctypes.c_int),
        ("sigev_notify", ctypes.c_int),
        ("sigev_notify_function", ctypes.c_void_p),
        ("sigev_notify_attributes", ctypes.c_void_p),
        ("_pad", ctypes.c_byte * (64 - 8 - 4 - 4 - 8 - 8)),
    ]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _native_exit_timer(seconds: float, code: int) -> str | None:
    """Calls ``_exit(code)`` on a thread the C library starts after ``seconds``; None if armed,
    else why not."""
    if not sys.platform.startswith("linux"):
        return f"no native timer on {sys.platform}"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        try:
            timer_create, timer_settime = libc.timer_create, libc.timer_settime
        except AttributeError:  # glibc < 2.34 keeps them in librt
            librt = ctypes.CDLL(ctypes.util.find_library("rt") or "librt.so.1", use_errno=True)
            timer_create, timer_settime = librt.timer_create, librt.timer_settime
        exit_fn = ctypes.cast(libc._exit, ctypes.c_void_p).value
        event = _Sigevent()
        event.sigev_value = code & 0xFF  # sival_int: _exit's argument
        event.sigev_notify = _SIGEV_THREAD
        event.sigev_notify_function = exit_fn
        timer = ctypes.c_void_p()
        if timer_create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) != 0:
            return f"timer_create failed: {os.strerror(ctypes.get_errno())}"
        whole = int(seconds)
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(whole, int((seconds - whole) * 1e9)))
        if timer_settime(timer, 0, ctypes.byref(spec), None) != 0:
            return f"timer_settime failed: {os.strerror(ctypes.get_errno())}"
        _keep.extend([libc, event, timer, spec])
        return None
    except (OSError, AttributeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"


def arm(code: int, run_dir: Path, bound: float) -> str | None:
    """Ends the process with ``code`` if teardown outlasts ``bound`` seconds; writes the Python
    stacks of every thread to the run directory first. Returns why it could not arm, or None."""
    if bound <= 0:
        return "turned off (TPUWATCH_TEARDOWN_S=0)"
    try:
        stacks = open(run_dir / STACKS_FILE, "w")  # noqa: SIM115 - must stay open until exit
        os.chmod(stacks.name, 0o600)
        _keep.append(stacks)
        faulthandler.dump_traceback_later(max(0.1, bound - 1.0), exit=False, file=stacks)
    except (OSError, ValueError, RuntimeError):
        pass  # the stacks are a courtesy; the exit timer is what matters
    return _native_exit_timer(bound, code)

"""Walking the garbage collector's objects from any thread without breaking another thread's
tuple building.

``gc.get_objects()`` returns a list holding every tracked object, the tuples another thread is
still building among them. CPython builds a tuple of unknown length (``tuple(generator)``) in
place and resizes it at the end, which fails with "SystemError: bad argument to internal
function" when anything else holds a reference to it by then. A script's step died of it
(TensorFlow's ``function_type.unpack_inputs``) while the leak doctor walked the heap: the
interpreter switched threads in the middle of the walk, and the script went on building its
tuple while the walk held it.

:func:`alone` keeps the other threads out of Python while a walk holds such references: it
raises the interpreter's switch interval to :data:`HOLD_S` and gives up the GIL once (a thread
that was already waiting for it under the old interval would otherwise still ask for it back
within that interval; once a switch has happened it waits again under the new one), and turns
automatic collection off (its finalizers run Python, which may block and let others in). A walk
inside it must not block (no I/O, no sleeps, no locks another thread holds) and must drop every
reference to what it does not keep before it ends; it should take milliseconds: the other
threads wait for it (a walk of a TensorFlow process's heap takes tens of ms; the give-up waits
for the thread that takes the GIL to give it back: at most ``HOLD_S``, for a pure-Python loop).
Keep lists, dicts, deques and tensors, never tuples. Pure-C ways to filter the list were tried:
``isinstance`` looks ``__class__`` up and ``itertools.tee`` keeps its last buffer, and both broke
the race test (tests/agent/test_heap_walk.py).
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from typing import Any, Iterator

#: The switch interval while a walk runs (s): far longer than any walk.
HOLD_S = 0.5


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """No other thread runs Python inside (see the module's docstring)."""
    interval = sys.getswitchinterval()
    enabled = gc.isenabled()
    sys.setswitchinterval(max(interval, HOLD_S))
    try:
        time.sleep(0)  # a switch: every thread waiting for the GIL now waits under HOLD_S
        gc.disable()
        yield
    finally:
        if enabled:
            gc.enable()
        sys.setswitchinterval(interval)


def objects_of(types: tuple[type, ...]) -> list[Any]:
    """The tracked objects whose type is exactly one of ``types`` (never ``tuple``)."""
    wanted = frozenset(types)
    if tuple in wanted:
        raise ValueError("tuples are what another thread may be building: never kept")
    with alone():
        objects = gc.get_objects()
        kept = [o for o in objects if type(o) in wanted]
        del objects
    return kept

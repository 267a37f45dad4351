"""Walking the garbage collector's objects from the agent's thread must never break the script's
own tuple building: CPython builds a tuple of unknown length in place and resizes it at the end,
which fails ("SystemError: bad argument to internal function") if anything else holds a reference
to it by then, and ``gc.get_objects()`` returns every tracked object, tuples being built among
them. A training step died of it in CI (TensorFlow's ``function_type.unpack_inputs``) while the
leak doctor's window ended."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from tpuwatch.agent import exit_guard, heap, leak_doctor

SECONDS = 3.0


def _numbers(n: int):
    yield from range(n)


def _race(walk) -> list[BaseException]:
    """Runs ``walk`` over and over while another thread builds tuples of unknown length, with
    thread switches as frequent as the interpreter allows; the builder's errors."""
    errors: list[BaseException] = []
    stop = threading.Event()

    def builder() -> None:
        while not stop.is_set():
            try:
                tuple(x for x in _numbers(50) if x % 3)
            except SystemError as e:
                errors.append(e)
                return

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=builder)
    thread.start()
    try:
        held = [list(range(20)) for _ in range(2000)]  # containers for the walk to find
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline and not errors:
            walk()
        del held
    finally:
        stop.set()
        thread.join(10)
        sys.setswitchinterval(interval)
    return errors


@pytest.mark.parametrize("walk", [
    lambda: leak_doctor._containers(roots=()),
    lambda: heap.objects_of((list, dict)),
    exit_guard.flush_open_files,
], ids=["leak-doctor-containers", "objects_of", "exit-guard-files"])
def test_a_heap_walk_never_breaks_a_tuple_another_thread_builds(walk):
    assert _race(walk) == []

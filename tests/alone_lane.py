"""The ``alone`` marker: a test that compares a script's timings before and after an edit runs
with no other test of the session beside it. On a 2-core box the other xdist worker's TensorFlow
run takes half the CPU: the sequential map's edit measured 43 % -> 8 % of the step alone, and
38 % -> 29 % beside another TF test in CI.

Under xdist each worker holds one lock while a test runs (its setup, module fixtures included,
its call and its teardown): shared for every other test, exclusive for an ``alone`` one. The
turnstile keeps tests that start later from overtaking an ``alone`` test that waits for the lock.
The lock files are in the session's temporary folder, which xdist gives each worker its own folder
under. A run without xdist has nothing beside its tests and takes no lock (nor does a pytest that
a test starts, unless it runs its own workers, with their own session folder).
"""

from __future__ import annotations

import fcntl
from pathlib import Path

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    worker = getattr(item.config, "workerinput", None)
    basetemp = item.config.option.basetemp
    if worker is None or not basetemp:  # not an xdist worker: nothing runs beside this test
        return (yield)
    root = Path(basetemp).parent  # the session's folder, shared by its workers
    exclusive = item.get_closest_marker("alone") is not None
    with open(root / "tpuwatch-alone.turnstile", "a") as turnstile, open(root / "tpuwatch-alone.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        return (yield)

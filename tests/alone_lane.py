"""The ``alone`` marker: a test that compares a script's timings before and after an edit runs
with no other test of the session beside it. On a 2-core box the other xdist worker's TensorFlow
run takes half the CPU: the sequential map's edit measured 43 % -> 8 % of the step alone, and
38 % -> 29 % beside another TF test in CI.

Every other test holds one lock shared while it runs, an ``alone`` test holds it exclusively; the
turnstile keeps tests that start later from overtaking an ``alone`` test that waits for it. The
lock files are in the session's temporary folder, which each xdist worker's own folder is under.
"""

from __future__ import annotations

import fcntl

import pytest


@pytest.fixture(autouse=True)
def alone_lock(request, tmp_path_factory):
    root = tmp_path_factory.getbasetemp().parent
    exclusive = request.node.get_closest_marker("alone") is not None
    with open(root / "tpuwatch-alone.turnstile", "a") as turnstile, open(root / "tpuwatch-alone.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield

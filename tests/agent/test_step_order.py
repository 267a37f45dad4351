"""Fit's step is ordered after its fetch is timed (what keeps fit's input wait true) without
moving the batch: each replica's data stays on its own device."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tpuwatch_testing import SCRIPTS, child_env

pytestmark = pytest.mark.tf


def test_ordering_fits_step_after_its_fetch_moves_no_data_between_devices():
    """The identities that make a step wait for its fetch's timestamp sit on each input's own
    device. Unplaced, they went to the default device, so every replica's batch made a round trip
    through device 0 each step (12 more transfers than the plain step here; on GPUs a copy of each
    replica's batch)."""
    out = subprocess.run([sys.executable, str(SCRIPTS / "fit_transfers.py")], capture_output=True, text=True,
                         timeout=240, env=child_env())
    assert out.returncode == 0, out.stderr[-3000:]
    counts = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert counts["disabled"] == "[]", counts
    assert int(counts["plain"]) > 0, counts
    assert int(counts["probed"]) == int(counts["plain"]), counts


def test_a_custom_loops_fetch_is_timed_with_one_crossing_edge_per_other_replica():
    """The fetch's second timestamp (on the host's CPU:0) waits for the first replica's part of
    the batch only; each other replica's part waits for it (the gate that keeps the step from
    starting ahead of the timestamp). It waited for every replica's part: 6 send/receive pairs a
    step on 4 replicas, the probes' largest in-graph cost."""
    out = subprocess.run([sys.executable, str(SCRIPTS / "loop_transfers.py")], capture_output=True, text=True,
                         timeout=240, env=child_env())
    assert out.returncode == 0, out.stderr[-3000:]
    counts = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert counts["disabled"] == "[]", counts
    assert int(counts["plain"]) > 0, counts
    assert int(counts["probed"]) - int(counts["plain"]) == 3, counts  # the gates of replicas 1-3

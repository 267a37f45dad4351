"""Fit's step is ordered after its fetch is timed (what keeps fit's input wait true) without
moving the batch: each replica's data stays on its own device."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tpuwatch_testing import SCRIPTS, child_env, run_and_report

pytestmark = pytest.mark.tf


def _sends(script: Path) -> dict[str, str]:
    """What a transfers script prints (``plain N``, ``probed N``, ``disabled [...]``), once it ran
    with no probe disabled and the plain step sent something."""
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                         env=child_env())
    assert out.returncode == 0, out.stderr[-3000:]
    counts = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert counts["disabled"] == "[]", counts
    assert int(counts["plain"]) > 0, counts
    return counts


def test_ordering_fits_step_after_its_fetch_moves_no_data_between_devices():
    """The identities that make a step wait for its fetch's timestamp sit on each input's own
    device. Unplaced, they went to the default device, so every replica's batch made a round trip
    through device 0 each step (12 more transfers than the plain step here; on GPUs a copy of each
    replica's batch)."""
    counts = _sends(SCRIPTS / "fit_transfers.py")
    assert int(counts["probed"]) == int(counts["plain"]), counts


def test_a_custom_loops_fetch_is_timed_with_one_crossing_edge_per_other_replica():
    """Both timestamps of the fetch and the wait between them are the last replica's device's
    (CPU:3); the second waits for that replica's part of the batch only, and the other replicas'
    parts wait for it (the gate that keeps the step from starting ahead of the timestamp): one
    edge out to CPU:1 and CPU:2, and one to the host's CPU:0, the wait, for the accumulator
    (CPU:0's part waits for what it adds). Nothing comes in: the first timestamp's order before
    the second (TF orders stateful ops) is an edge within CPU:3's graph. It waited for every
    replica's part: 6 send/receive pairs a step on 4 replicas, the probes' largest in-graph cost;
    then 4, with the first timestamp on the host (its order an edge in, and the second's value
    out to the host for the wait)."""
    counts = _sends(SCRIPTS / "loop_transfers.py")
    assert int(counts["probed"]) - int(counts["plain"]) == 3, counts


def test_the_wait_for_a_batch_made_per_replica_is_the_wait_for_its_last_part(tmp_path):
    """distribute_datasets_from_function: each replica's part is a whole element of the host
    pipeline, handed to the devices in turn. A timestamp waiting for the first part only read
    9.8 % input wait on this loop where plain TF spends ~90 % of each step waiting (4 x 4 ms of
    input a ~18 ms step); waiting for the last part reads 85-87 %, as waiting for all did."""
    summary = run_and_report(tmp_path, SCRIPTS / "per_replica_input.py", options=("--no-auto-profile",))["summary"]
    assert summary["steps"] == 120, summary
    assert summary["input_wait"]["share"] >= 0.6, summary["input_wait"]


def test_a_custom_loop_that_reduces_its_losses_keeps_them_with_one_write_on_the_host():
    """Where the replicas are this host's CPUs and the step hands each replica's loss to
    ``strategy.reduce`` (the tutorials' shape), the reduction already copies each loss to the
    host: the probe stacks those copies into one variable there, and adds no transfer. It wrote
    one variable a replica, beside each (4 writes and 4 more inputs a step on 4 replicas). A step
    that returns its losses unreduced has them stacked on the host as the function ends (whether
    that adds transfers is where TensorFlow places the function's outputs: not asked here).
    Either way the agent reads what the step computed, replica by replica."""
    out = subprocess.run([sys.executable, str(SCRIPTS / "loss_writes.py")], capture_output=True, text=True,
                         timeout=240, env=child_env())
    assert out.returncode == 0, out.stderr[-3000:]
    lines = {line.split(" ", 1)[0]: line.split()[1:] for line in out.stdout.splitlines() if line.strip()}
    assert lines["disabled"] == ["[]"], lines
    reduced = dict(zip(lines["reduced"][0::2], lines["reduced"][1::2]))
    assert reduced == {"host": "1", "replicas": "0", "sends": "0", "match": "True"}, reduced
    kept = dict(zip(lines["kept"][0::2], lines["kept"][1::2]))
    assert (kept["host"], kept["replicas"], kept["match"]) == ("1", "0", "True"), kept
    assert lines["left"] == ["0", "0"], lines  # a trace that raised keeps nothing alive

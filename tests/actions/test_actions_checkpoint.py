"""Checkpoints requested while real training runs (4 replicas, MirroredStrategy on logical CPUs)."""

from __future__ import annotations

import pytest
from actions_live import LiveRun, restore, weights_by_iteration

pytestmark = pytest.mark.tf


def test_fifty_checkpoints_each_restore_to_the_weights_of_their_own_step(tmp_path):
    log = tmp_path / "weights.txt"
    run = LiveRun(tmp_path, "--mode", "custom", "--weights-log", str(log), "--sleep-ms", "2")
    try:
        run.wait_for_steps(2)
        results = []
        for _ in range(50):  # back to back: the next request as the previous result arrives
            outcome = run.command("checkpoint")
            assert outcome.result.ok, outcome.result.message
            results.append(outcome.result)
    finally:
        code = run.stop()
    assert code == 0, run.output()
    steps = [r.details["step"] for r in results]
    assert steps == sorted(steps) and len(set(steps)) >= 10, steps  # taken while training went on
    saved = weights_by_iteration(log)
    restored = restore([r.details["path"] for r in results])
    assert len(restored) == 50
    for r, got in zip(results, restored):
        # The step counter, the optimizer's iterations and the weights all belong to one step...
        assert got["step"] == r.details["step"] == got["iterations"], (r, got["step"], got["iterations"])
        # ...and the weights are bit for bit those the script had after that step.
        assert got["weights"] == saved[got["iterations"]], r.details
        assert r.details["bytes"] > 0 and r.details["path"].startswith(str(run.run_dir / "checkpoints"))


@pytest.mark.parametrize("mode", ["fit", "own-manager"])
def test_fit_model_and_the_scripts_own_manager_are_what_gets_saved(tmp_path, mode):
    own_dir = tmp_path / "own"
    args = ["--mode", "fit"] if mode == "fit" else ["--mode", "custom", "--own-manager", str(own_dir)]
    run = LiveRun(tmp_path, *args, "--sleep-ms", "5")
    try:
        run.wait_for_steps(2)
        results = [run.command("checkpoint").result for _ in range(3)]
    finally:
        code = run.stop()
    assert code == 0, run.output()
    assert all(r.ok for r in results), [r.message for r in results]
    paths = [r.details["path"] for r in results]
    if mode == "fit":
        assert all(r.details["saved"] == "model, optimizer" for r in results)
        restored = restore(paths)
        assert [g["step"] for g in restored] == [r.details["step"] for r in results]
        assert [g["iterations"] for g in restored] == [r.details["step"] for r in results]
    else:
        # The script's own format, beside its directory (never through its manager, which would
        # rotate the script's own checkpoints out); the step is the checkpoint number.
        assert all(r.details["saved"] == "the script's tf.train.Checkpoint" for r in results)
        assert paths == [str(own_dir / "tpuwatch" / f"ckpt-{r.details['step']}") for r in results]
        restored = restore(paths, own=True)
        assert [g["iterations"] for g in restored] == [r.details["step"] for r in results]


def test_requested_checkpoints_never_rotate_the_scripts_own_out(tmp_path):
    """The script keeps its last 3 checkpoints (max_to_keep=3) and saved 3; a token holder asks
    for 3 more within a second. Before: they went through the script's manager, which deleted
    the script's ckpt-3, ckpt-6 and ckpt-9 (a way to destroy training progress at 5 a second)."""
    import tensorflow as tf

    own_dir = tmp_path / "own"
    run = LiveRun(tmp_path, "--mode", "custom", "--own-manager", str(own_dir), "--own-keep", "3",
                  "--own-save-at", "3,6,9", "--sleep-ms", "5")
    try:
        run.wait_for_steps(12)
        results = [run.command("checkpoint").result for _ in range(3)]
    finally:
        code = run.stop()
    assert code == 0, run.output()
    assert all(r.ok for r in results), [r.message for r in results]
    for step in (3, 6, 9):
        assert (own_dir / f"ckpt-{step}.index").exists(), sorted(p.name for p in own_dir.iterdir())
    assert tf.train.latest_checkpoint(str(own_dir)) == str(own_dir / "ckpt-9")  # the script's own index
    assert [r.details["path"] for r in results] == [str(own_dir / "tpuwatch" / f"ckpt-{r.details['step']}")
                                                    for r in results]
    restored = restore([r.details["path"] for r in results], own=True)
    assert [g["iterations"] for g in restored] == [r.details["step"] for r in results]

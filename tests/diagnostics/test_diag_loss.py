"""loss-nonfinite and replica-loss-skew from per-replica losses."""

import math

import pytest
from diag_synthetic import T0, SyntheticRun, findings

from tpuwatch.protocol import Step, StepLoss


def test_nan_on_one_replica_is_critical_and_names_replica_and_step():
    run = SyntheticRun()
    run.steps(119)
    run.steps(30, loss=lambda s, r, v: math.nan if r == 2 else v)
    (f,) = findings(run.engine(), "loss-nonfinite")
    assert f.severity == "critical"
    assert f.evidence["replica"] == 2 and f.evidence["first_step"] == 120
    assert f.evidence["device"].endswith("CPU:2")
    assert f.first_step == 120 and f.last_step == 149
    assert "learning rate" in f.advice and "loss scal" in f.advice.lower()
    assert "replica 2" in f.message and "step 120" in f.message


def test_nan_between_two_reads_says_the_step_it_was_read_at_and_the_last_finite_read():
    # Losses read on every 5th step (the agent's pace on a short run's dear reads): replica 1 goes
    # NaN at step 12, every replica at 13. The first read that sees it is step 15's, every replica
    # non-finite: the finding must not say the loss went non-finite at step 15 on all at once
    run = SyntheticRun()
    run.steps(11, losses_every=5)
    run.steps(1, loss=lambda s, r, v: math.nan if r == 1 else v, losses_every=5)
    run.steps(20, loss=lambda s, r, v: math.nan, losses_every=5)
    (f,) = findings(run.engine(), "loss-nonfinite")
    assert f.evidence["first_step"] == 15 and f.evidence["last_finite_step"] == 10
    assert f.evidence["replica"] == "all"
    assert "between step 10 and step 15" in f.message and "from step 15" not in f.message
    assert "TPUWATCH_LOSS_EVERY_S=0" in f.advice  # to tell which replica went first


def test_nan_on_one_replica_between_two_reads_names_it_and_the_steps():
    run = SyntheticRun()
    run.steps(9, losses_every=5)
    run.steps(20, loss=lambda s, r, v: math.nan if r == 2 else v, losses_every=5)
    (f,) = findings(run.engine(), "loss-nonfinite")
    assert f.evidence["replica"] == 2 and f.evidence["first_step"] == 10
    assert f.evidence["last_finite_step"] == 5
    assert "replica 2" in f.message and "between step 5 and step 10" in f.message


def test_nan_inside_a_call_of_several_steps_says_the_call_not_the_reads():
    # steps_per_execution=8: every record is read, and each holds the last of its call's 8 steps
    run = SyntheticRun()
    for call in range(1, 6):
        bad = call >= 4
        losses = tuple(math.nan if bad else 0.5 for _ in range(4))
        run.emit(Step(step=8 * call, t=T0 + call, step_time_s=0.05, input_wait_s=None,
                      loss=math.nan if bad else 0.5, replica_losses=losses, steps=8))
    (f,) = findings(run.engine(), "loss-nonfinite")
    assert f.evidence["first_step"] == 32 and f.evidence["last_finite_step"] == 24
    assert "between step 24 and step 32 (one call ran them" in f.message
    assert "TPUWATCH_LOSS_EVERY_S" not in f.advice  # reading more often would not show them


def test_nan_seen_only_when_training_paused_is_found():
    # The last record of an epoch went without its losses; they were read when training paused
    # (StepLoss), and they are NaN: the only read of that step
    run = SyntheticRun()
    run.steps(12, losses_every=5)
    run.emit(StepLoss(t=run.t + 0.1, step=12, loss=math.nan, replica_losses=(0.5, math.nan, 0.5, 0.5)))
    (f,) = findings(run.engine(), "loss-nonfinite")
    assert f.evidence["replica"] == 1 and f.evidence["first_step"] == 12
    assert f.evidence["last_finite_step"] == 10 and "between step 10 and step 12" in f.message


def test_inf_on_second_worker_uses_global_replica_index():
    run = SyntheticRun(workers=2, local_replicas=2)
    run.steps(10)
    run.steps(1, loss=lambda s, r, v: math.inf if r == 3 else v)
    (f,) = findings(run.engine(), "loss-nonfinite")
    assert f.evidence["replica"] == 3 and f.evidence["value"] == "inf"
    assert f.worker == "host1:101"


def test_finite_losses_are_silent():
    run = SyntheticRun()
    run.steps(300)
    assert findings(run.engine(), "loss-nonfinite") == []


def skewed(factor: float, replica: int = 1, n: int = 300, **kw) -> SyntheticRun:
    run = SyntheticRun(**kw)
    run.steps(n, loss=lambda s, r, v: v * factor if r == replica else v)
    return run


def test_skew_just_below_relative_gap_is_silent():
    assert findings(skewed(1.08).engine(), "replica-loss-skew") == []


def test_skew_just_above_relative_gap_fires_on_that_replica():
    (f,) = findings(skewed(1.12).engine(), "replica-loss-skew")
    assert f.severity == "warning"
    assert f.evidence["replica"] == 1
    assert f.evidence["device"].endswith("CPU:1")
    assert 10 <= f.evidence["relative_gap_pct"] <= 14
    assert "shard" in f.advice.lower() and "AutoShardPolicy" in f.advice


def test_lower_loss_replica_is_found_too():
    (f,) = findings(skewed(0.8, replica=3).engine(), "replica-loss-skew")
    assert f.evidence["replica"] == 3 and "lower" in f.message


def test_single_outlier_step_is_silent():
    run = SyntheticRun()
    run.steps(300, loss=lambda s, r, v: v * 10 if (r == 1 and s == 150) else v)
    assert findings(run.engine(), "replica-loss-skew") == []


def test_too_few_steps_is_silent():
    assert findings(skewed(2.0, n=40).engine(), "replica-loss-skew") == []


def test_skew_read_on_every_fifth_step_of_an_80_step_run_fires():
    # The agent's default pace reads a short run's losses on some steps only (where a read is dear
    # next to a step): 16 reads over 80 steps show as persistent a gap as 80 reads
    run = SyntheticRun()
    run.steps(80, loss=lambda s, r, v: v * 8 if r == 2 else v, losses_every=5)
    (f,) = findings(run.engine(), "replica-loss-skew")
    assert f.evidence["replica"] == 2 and f.evidence["window_steps"] == 16
    assert (f.first_step, f.last_step) == (5, 80)


def test_sparse_reads_over_too_few_steps_are_silent():
    # 20 reads, but of 40 steps only: the gap has not been seen over 50 steps
    run = SyntheticRun()
    run.steps(40, loss=lambda s, r, v: v * 2 if r == 1 else v, losses_every=2)
    assert findings(run.engine(), "replica-loss-skew") == []


def test_too_few_reads_are_silent_however_many_steps_they_span():
    # 15 reads over 150 steps: too few values to tell a persistent gap from noise
    run = SyntheticRun()
    run.steps(150, loss=lambda s, r, v: v * 2 if r == 1 else v, losses_every=10)
    assert findings(run.engine(), "replica-loss-skew") == []


def test_reads_bunched_in_a_few_steps_of_the_span_are_silent():
    # 20 reads on steps 1-20 and two more at 60 and 100: the span is 100 steps, but the gap was
    # seen over 20 of them (the steps every worker read can fall like this at the default pace)
    run = SyntheticRun()
    run.steps(20, loss=lambda s, r, v: v * 2 if r == 1 else v)
    run.steps(80, loss=lambda s, r, v: v * 2 if r == 1 else v, losses_every=40)
    assert findings(run.engine(), "replica-loss-skew") == []


@pytest.mark.parametrize("noise", [0.10, 0.50])
def test_noisy_replicas_read_sparsely_are_silent(noise):
    # 10 % and 50 % per-replica noise (small per-replica batches), read on every 5th step of a
    # 100-step run (20 values a replica), over 50 runs
    for seed in range(50):
        run = SyntheticRun(loss_noise=noise, seed=seed)
        run.steps(100, losses_every=5)
        assert findings(run.engine(), "replica-loss-skew") == [], seed


def test_tiny_losses_are_silent():
    # relative gap 100 %, but 1e-4 in absolute terms: converged, nothing to fix
    run = SyntheticRun()
    run.clean_loss = lambda s: 1e-4
    run.steps(300, loss=lambda s, r, v: v * 2 if r == 1 else v)
    assert findings(run.engine(), "replica-loss-skew") == []


def test_two_replicas_cannot_tell_which_is_off():
    assert findings(skewed(1.5, local_replicas=2).engine(), "replica-loss-skew") == []


def test_noisy_replicas_without_skew_are_silent():
    # 10 % per-replica noise (small per-replica batches) for 1000 steps
    run = SyntheticRun(loss_noise=0.10, seed=7)
    run.steps(1000)
    assert findings(run.engine(), "replica-loss-skew") == []


def test_skew_across_workers_aligns_steps():
    run = SyntheticRun(workers=3, local_replicas=1)
    run.steps(300, loss=lambda s, r, v: v * 1.3 if r == 2 else v)
    (f,) = findings(run.engine(), "replica-loss-skew")
    assert f.evidence["replica"] == 2 and f.worker == "host2:102"


def corrupted_from(step: int, factor: float, nan_at: int = 23, replica: int = 3) -> SyntheticRun:
    """One replica's data corrupted from ``step`` (its loss ``factor`` x the others'), the loss
    non-finite everywhere from ``nan_at`` (the poisoned weights)."""
    run = SyntheticRun()

    def loss(s: int, r: int, v: float) -> float:
        if s >= nan_at:
            return math.nan if r == 0 else math.inf
        return v * factor if (r == replica and s >= step) else v

    run.steps(30, loss=loss)
    return run


def test_replica_departing_before_a_nonfinite_loss_is_named_as_its_origin():
    eng = corrupted_from(20, 1e6).engine()
    (nf,) = findings(eng, "loss-nonfinite")
    assert nf.evidence["replica"] == "all"  # every replica overflowed at once (said once)...
    assert nf.evidence["origin_replica"] == 3 and nf.evidence["origin_from_step"] == 20
    assert "replica 3, whose loss was 10^6x the others' from step 20" in nf.message
    (skew,) = findings(eng, "replica-loss-skew")  # ...with far fewer than 50 steps
    assert skew.evidence["replica"] == 3 and skew.evidence["from_step"] == 20
    assert skew.evidence["nonfinite_step"] == 23
    assert "replica 3 (" in skew.message and "10^6x the others' from step 20" in skew.message


def test_origin_ratio_threshold():
    # 9x the others just before the NaN: not a departure; 11x: it is
    eng = corrupted_from(20, 9.0).engine()
    assert "origin_replica" not in findings(eng, "loss-nonfinite")[0].evidence
    assert findings(eng, "replica-loss-skew") == []
    eng = corrupted_from(20, 11.0).engine()
    assert findings(eng, "loss-nonfinite")[0].evidence["origin_replica"] == 3
    (skew,) = findings(eng, "replica-loss-skew")
    assert skew.evidence["loss_ratio_to_others"] >= 10


def test_nonfinite_everywhere_at_once_names_no_origin():
    run = SyntheticRun()
    run.steps(20)
    run.steps(5, loss=lambda s, r, v: math.nan)
    eng = run.engine()
    assert "origin_replica" not in findings(eng, "loss-nonfinite")[0].evidence
    assert findings(eng, "replica-loss-skew") == []


def test_a_replica_whose_loss_collapses_to_zero_before_a_nonfinite_loss_is_named():
    # garbage inputs can make one replica's loss exactly 0 (saturated logits) before the NaN
    run = SyntheticRun()
    run.steps(30, loss=lambda s, r, v: math.nan if s >= 25 else (0.0 if r == 2 and s >= 20 else v))
    eng = run.engine()
    assert findings(eng, "loss-nonfinite")[0].evidence["origin_replica"] == 2
    (skew,) = findings(eng, "replica-loss-skew")
    assert skew.evidence["direction"] == "lower" and skew.evidence["from_step"] == 20
    assert "loss was 0 against the others'" in skew.message


def test_one_more_non_finite_replica_is_named_in_the_singular():
    """The tryout read "later also replicas 0" for a single replica."""
    run = SyntheticRun()
    run.steps(10)
    run.steps(1, loss=lambda s, r, v: math.nan if r == 2 else v)
    run.steps(5, loss=lambda s, r, v: math.nan if r in (1, 2) else v)
    (f,) = findings(run.engine(), "loss-nonfinite")
    assert "later also replica 1" in f.message and "replicas 1" not in f.message

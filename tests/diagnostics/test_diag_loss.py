"""loss-nonfinite and replica-loss-skew from per-replica losses."""

import math

from diag_synthetic import SyntheticRun, findings


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

"""batch-size-alignment and float32-on-tpu: only when the Topology says TPU."""

from diag_synthetic import SyntheticRun, findings

from tpuwatch.protocol import Config


def tpu_run(config: Config | None, is_tpu: bool = True, examples: int | None = None,
            local_replicas: int = 8):
    run = SyntheticRun(is_tpu=is_tpu, config=config, local_replicas=local_replicas)
    run.steps(10, examples=examples)
    return run.engine()


def test_multiple_of_128_is_silent():
    eng = tpu_run(Config(t=0.0, per_replica_batch_size=128, mixed_precision="mixed_bfloat16"))
    assert findings(eng) == []


def test_multiple_of_8_not_128_is_info_with_suggestions():
    (f,) = findings(tpu_run(Config(t=0.0, per_replica_batch_size=96)), "batch-size-alignment")
    assert f.severity == "info"
    assert f.evidence["per_replica_batch"] == 96 and f.evidence["suggested_upper"] == 128
    assert "128" in f.advice and "global 1024" in f.advice


def test_not_multiple_of_8_is_warning_with_nearest_multiples():
    (f,) = findings(tpu_run(Config(t=0.0, per_replica_batch_size=200)), "batch-size-alignment")
    assert f.severity == "info"  # a multiple of 8: no padding, MXU rows partly idle
    assert (f.evidence["suggested_lower"], f.evidence["suggested_upper"]) == (128, 256)
    assert "128 or 256" in f.advice
    (f,) = findings(tpu_run(Config(t=0.0, per_replica_batch_size=100)), "batch-size-alignment")
    assert f.severity == "warning"
    assert f.evidence["padded_to"] == 104 and f.evidence["padding_waste_pct"] == 4


def test_from_global_batch_and_from_step_examples():
    (f,) = findings(tpu_run(Config(t=0.0, global_batch_size=800)), "batch-size-alignment")
    assert f.evidence["per_replica_batch"] == 100
    assert findings(tpu_run(Config(t=0.0, global_batch_size=1024)), "batch-size-alignment") == []
    (f,) = findings(tpu_run(None, examples=8 * 48), "batch-size-alignment")
    assert f.evidence["per_replica_batch"] == 48


def test_not_on_tpu_is_silent():
    eng = tpu_run(Config(t=0.0, per_replica_batch_size=100, mixed_precision="float32"),
                  is_tpu=False)
    assert findings(eng) == []


def test_float32_policy_on_tpu():
    (f,) = findings(tpu_run(Config(t=0.0, mixed_precision="float32", per_replica_batch_size=128)),
                    "float32-on-tpu")
    assert f.severity == "info" and "mixed_bfloat16" in f.advice
    assert findings(tpu_run(Config(t=0.0, mixed_precision="mixed_bfloat16")),
                    "float32-on-tpu") == []


def test_unset_policy_on_tpu_counts_once_training_started():
    run = SyntheticRun(is_tpu=True)
    eng = run.engine()
    assert findings(eng, "float32-on-tpu") == []  # no step yet: the policy may still come
    run.steps(3)
    run.feed(eng)
    (f,) = findings(eng, "float32-on-tpu")
    assert "unset" in f.message

"""retrace-storm and function-recreated, from Retrace messages."""

from diag_synthetic import SyntheticRun, findings


def storm(traces: int, change: str = "x: shape (64, 28, 28, 1) -> (37, 28, 28, 1)"):
    run = SyntheticRun()
    run.steps(3)
    run.retrace("train_step", 1, 1, "")
    for k in range(2, traces + 1):
        run.steps(2)
        run.retrace("train_step", k, 1, change)
    run.steps(5)
    return run.engine()


def test_keras_train_and_test_functions_with_partial_batches_are_silent():
    # Keras 3 names both the train and the test function multi_step_on_iterator; each traces
    # for the full and the last partial batch (reduce_retracing: then never again)
    run = SyntheticRun()
    run.retrace("multi_step_on_iterator", 1, 1, "")
    run.steps(100)
    run.retrace("multi_step_on_iterator", 2, 1, "iterator: shape (64, 10) -> (None, 10)")
    run.steps(1)
    run.retrace("multi_step_on_iterator", 3, 2, "")
    run.retrace("multi_step_on_iterator", 4, 2, "iterator: shape (64, 10) -> (None, 10)")
    run.steps(200)
    eng = run.engine()
    assert findings(eng, "retrace-storm") == []
    assert findings(eng, "function-recreated") == []


def test_second_retrace_with_the_same_cause_is_an_info_with_the_fix():
    # one re-trace (the last partial batch) is legitimate: silent
    assert findings(storm(2), "retrace-storm") == []
    # the second re-trace of the same object for the same cause: info, with the advice
    (f,) = findings(storm(3), "retrace-storm")
    assert f.severity == "info" and f.evidence["same_cause_retraces"] == 2
    assert f.evidence["change_kind"] == "batch dimension"
    assert "drop_remainder=True" in f.advice and "None batch dimension" in f.advice
    # the case: 4 traces with a changing batch dimension, below the storm threshold
    (f,) = findings(storm(4), "retrace-storm")
    assert f.severity == "info" and "4 times" in f.message


def test_retraces_with_different_causes_are_not_repeated():
    run = SyntheticRun()
    run.retrace("train_step", 1, 1, "")
    run.steps(3)
    run.retrace("train_step", 2, 1, "x: shape (64, 28, 28, 1) -> (37, 28, 28, 1)")
    run.steps(3)
    run.retrace("train_step", 3, 1, "x: dtype float32 -> float64")
    run.steps(3)
    assert findings(run.engine(), "retrace-storm") == []


def test_storm_threshold():
    # allowance: 1 retrace per object; a storm is 3 more
    (f,) = findings(storm(4), "retrace-storm")
    assert f.severity == "info"
    (f,) = findings(storm(5), "retrace-storm")
    assert f.severity == "warning"
    assert f.evidence["function"] == "train_step"
    assert f.evidence["traces"] == 5 and f.evidence["excess_traces"] == 3
    assert f.evidence["change_kind"] == "batch dimension"
    assert "drop_remainder=True" in f.advice and "input_signature" in f.advice
    assert "(64, 28, 28, 1) -> (37, 28, 28, 1)" in f.advice


def test_big_storm_is_critical():
    (f,) = findings(storm(40), "retrace-storm")
    assert f.severity == "critical"


def test_python_scalar_change_advises_a_tensor():
    (f,) = findings(storm(6, change="lr: 0.001 -> 0.0009"), "retrace-storm")
    assert f.evidence["change_kind"] == "python value"
    assert "tensor" in f.advice


def test_non_batch_shape_change_advises_padding():
    (f,) = findings(storm(6, change="tokens: shape (32, 117) -> (32, 95)"), "retrace-storm")
    assert f.evidence["change_kind"] == "shape"
    assert "padded_batch" in f.advice


def recreated(instances: int):
    run = SyntheticRun()
    for k in range(1, instances + 1):
        run.steps(1)
        run.retrace("loss_fn", k, k, "")
    return run.engine()


def test_recreated_threshold_and_not_a_storm():
    assert findings(recreated(9), "function-recreated") == []
    eng = recreated(10)
    (f,) = findings(eng, "function-recreated")
    assert f.severity == "warning"
    assert f.evidence["function"] == "loss_fn" and f.evidence["instances"] == 10
    assert "outside the training loop" in f.advice
    assert findings(eng, "retrace-storm") == []  # one trace per object is not a storm


def test_functions_are_per_worker():
    run = SyntheticRun(workers=2)
    for k in range(1, 6):
        run.retrace("train_step", k, 1, "x: shape (8, 3) -> (7, 3)", worker=1)
    (f,) = findings(run.engine(), "retrace-storm")
    assert f.worker == "host1:101"


def test_the_trace_again_after_a_first_call_made_variables_is_no_retrace_problem():
    """Counted as TF counts it (the tryout's 17 traces), but it happens once per function: with
    one partial-batch retrace after it, still silent, and the advice never mistakes it for a
    changing Python value."""
    from tpuwatch.protocol import VARIABLES_MADE_CHANGE

    def run(shape_changes: int):
        r = SyntheticRun()
        r.retrace("train_step", 1, 1, "")
        r.retrace("train_step", 2, 1, VARIABLES_MADE_CHANGE)
        for k in range(shape_changes):
            r.steps(20)
            r.retrace("train_step", 3 + k, 1, f"x: shape (64, 28, 28, 1) -> ({37 - k}, 28, 28, 1)")
        r.steps(5)
        return r.engine()

    assert findings(run(1), "retrace-storm") == []
    (f,) = findings(run(2), "retrace-storm")
    assert f.evidence["change_kind"] == "batch dimension" and VARIABLES_MADE_CHANGE not in f.evidence["recent_changes"]

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


def _s3_retraces(upto_step: int | None = None):
    """The tester's s3_retrace.py (a Python int ``phase`` 0..3 and batch sizes 32/17/9/5): the
    agent's 16 Retrace records, signature and change as recorded (the change is against the
    previous trace)."""
    from tpuwatch.protocol import Retrace

    out, prev, traces = [], None, 0
    for phase in range(4):
        for i, bs in ((0, 32), (3, 17), (5, 9), (8, 5)):
            traces += 1
            sig = f"xb: float32({bs}, 8), yb: float32({bs}, 1), phase: {phase}"
            if prev is None:
                change = ""
            else:
                pbs, pphase = prev
                change = f"xb: shape ({pbs}, 8) -> ({bs}, 8); yb: shape ({pbs}, 1) -> ({bs}, 1)"
                if pphase != phase:
                    change += f"; phase: python int {pphase} -> {phase}"
            prev = (bs, phase)
            step = 30 * phase + i
            if upto_step is not None and step > upto_step:
                return out
            out.append(Retrace(t=1.0 + traces, function="train_step", traces=traces, instances=1,
                               signature=sig, change=change, step=step))
    return out


def _engine_with(msgs):
    run = SyntheticRun()
    run.steps(2)
    for m in msgs:
        run.emit(m)
    return run.engine()


def test_retrace_cause_is_the_difference_to_the_closest_traced_signature():
    # step 30: (32, 8) was traced already; only the Python int changed
    (f,) = findings(_engine_with(_s3_retraces(upto_step=30)), "retrace-storm")
    assert f.evidence["last_change"] == "phase: python int 0 -> 1"
    # so far three re-traces for new batch sizes, one for the Python value: both named, the
    # advice for each
    assert f.message.endswith("changing: batch dimension (3), python value (1)")
    assert "drop_remainder" in f.advice and "pass it as a tensor" in f.advice
    assert f.advice.endswith("Last change: phase: python int 0 -> 1")


def test_retrace_advice_follows_the_dominant_cause():
    # the whole run: 12 of the 15 re-traces are the Python int (every batch size was traced
    # with phase 0 already); the fix is to pass phase as a tensor
    (f,) = findings(_engine_with(_s3_retraces()), "retrace-storm")
    assert f.evidence["change_kind"] == "python value"
    assert f.message.endswith("changing: python value (12), batch dimension (3)")
    assert f.advice.startswith("a Python value changes between calls: pass it as a tensor")
    assert f.evidence["last_change"] == "phase: python int 2 -> 3"


def test_the_retraces_panel_and_screen_quote_the_same_cause():
    # RunState feeds the Retraces panel ("last change") and screen (every retrace): the same
    # difference to the closest traced signature as the finding
    from tpuwatch.monitor.state import RunState

    state = RunState()
    for m in _s3_retraces(upto_step=33):
        state.apply(m)
    snap = state.snapshot(now=100.0)
    (fn,) = snap.functions
    assert fn.last_change == "phase: python int 0 -> 1"  # (17, 8) was traced with phase 0
    assert [r.change for r in snap.retraces][-2:] == ["phase: python int 0 -> 1"] * 2


def test_signatures_that_cannot_be_read_keep_the_agents_change():
    from tpuwatch.monitor.diagnostics.tracing import closest_change, parse_signature

    assert parse_signature("mode: 'a, b', x: float32(None, 8) x4") == {"mode": "'a, b'", "x": "float32(None, 8) x4"}
    assert parse_signature("x: float32(8, 8), y: int32(8" + "..." ) is None  # cut at 300 characters
    seen = [parse_signature("x: float32(32, 8), lr: 0.1")]
    assert closest_change(seen, "x: float32(16, 8), lr: 0.2") == \
        "x: shape (32, 8) -> (16, 8); lr: python float 0.1 -> 0.2"
    assert closest_change(seen, "x: float32(32, 8), lr: 0.1") == ""  # same inputs: another object
    assert closest_change(seen, "(x)") == ""
    assert parse_signature("(x: float32[16, 28], y: int64[16])") is None  # an older agent's form


def _batch_sizes(sizes):
    from tpuwatch.protocol import Retrace

    out = []
    for k, bs in enumerate(sizes, start=1):
        change = "" if k == 1 else f"x: shape ({sizes[k - 2]}, 28, 28, 1) -> ({bs}, 28, 28, 1)"
        out.append(Retrace(t=1.0 + k, function="train_step", traces=k, instances=1,
                           signature=f"x: float32({bs}, 28, 28, 1), y: int64({bs})", change=change, step=10 * k))
    return out


def test_a_batch_size_the_script_varies_is_not_told_to_drop_the_remainder():
    # a tester's loop changed the batch size each epoch: the advice led with drop_remainder=True,
    # and that edit left 8 traces and the warning; reduce_retracing=True left 3 and no finding
    (f,) = findings(_engine_with(_batch_sizes([64, 48, 32, 16, 8])), "retrace-storm")
    assert f.evidence["change_kind"] == "batch dimension" and f.evidence["batch_sizes"] == "64, 48, 32, 16, 8"
    assert f.advice.startswith("the batch size itself changes (5 sizes traced: 64, 48, 32, 16, 8)"), f.advice
    assert "reduce_retracing=True" in f.advice and "drop_remainder" not in f.advice.split(".")[0], f.advice
    # sizes the signatures do not tell (cut at their length limit): the remainder is the usual cause
    (f,) = findings(storm(4), "retrace-storm")
    assert f.advice.startswith("only the batch dimension changes: batch with drop_remainder=True"), f.advice
    assert "batch_sizes" not in f.evidence

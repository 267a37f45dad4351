"""Trace flags on their own (no TensorFlow): a mark lands on every function being traced and on the
top-level call, a nested function's flags propagate to its callers except its own, and an eager
strategy.run under way keeps the marks made while it runs."""

from __future__ import annotations

from types import SimpleNamespace

from tpuwatch.agent.trace_flags import TraceFlags


class _Fn:
    """Stands for a tf.function (weak-referenceable, hashable)."""


def _flags(depth: int = 0) -> tuple[TraceFlags, SimpleNamespace]:
    marked: list = []
    run = SimpleNamespace(depth=depth, marked=lambda key, value: marked.append((key, value)), seen=marked)
    return TraceFlags(run), run  # type: ignore[arg-type]


def test_a_mark_lands_on_every_function_being_traced_and_the_top_level_call():
    trace, run = _flags()
    top, outer, inner, other = _Fn(), _Fn(), _Fn(), _Fn()
    trace.current_top = top
    trace.tracing[:] = [(outer, None), (inner, None)]
    trace.mark("training")
    trace.mark("loss", "slot")
    for fn in (top, outer, inner):
        assert trace.flags_of(fn) == {"training": True, "loss": "slot"}
    assert trace.flags_of(other) == {}
    assert trace.training_marks == 1 and run.seen == []


def test_a_nested_functions_flags_propagate_but_not_its_own():
    trace, _ = _flags()
    caller = _Fn()
    trace.tracing[:] = [(caller, None)]
    trace.propagate({"training": True, "acc": True, "_name": "inner", "_read": True, "implicit_runs": 2})
    assert trace.flags_of(caller) == {"training": True, "acc": True}


def test_an_eager_strategy_run_keeps_the_marks_made_while_it_runs():
    trace, run = _flags(depth=1)
    trace.mark("training")
    trace.mark("loss_scaled", False)
    assert run.seen == [("training", True), ("loss_scaled", False)]


def test_what_cannot_be_weakly_referenced_is_never_flagged():
    trace, _ = _flags()
    trace.current_top = 3  # an int: not weak-referenceable, never a step function
    trace.mark("training")
    assert trace.flags_of(3) == {} and len(trace.flags) == 0

"""Keras' evaluation function is not a retrace of training: fit(validation_data=...)
showed `multi_step_on_iterator: 2 trace(s), 2 object(s); last change new tf.function object`."""

from __future__ import annotations

import pytest

from tpuwatch.console.headless import progress_line, summary
from tpuwatch.monitor.monitor import Monitor
from tpuwatch.protocol import VARIABLES_MADE_CHANGE, Retrace
from tpuwatch_testing import SCRIPTS

pytestmark = pytest.mark.tf


def test_fit_with_validation_lists_the_test_function_as_evaluation(run_agent):
    r = run_agent(SCRIPTS / "fit_validation.py")
    assert r.returncode == 0, r.output[-2000:]
    traces = r.of(Retrace)
    # Keras' step function: multi_step_on_iterator from 3.4 (and for steps_per_execution > 1),
    # one_step_on_iterator before (CI's oldest pair runs Keras 3.3)
    (name,) = {m.function for m in traces if m.function in ("multi_step_on_iterator", "one_step_on_iterator")}
    train = [m for m in traces if m.function == name and not m.evaluation]
    evaluation = [m for m in traces if m.function == name and m.evaluation]
    # one training object, traced once (again only where its first call made variables: an
    # optimizer built lazily, on older Keras)
    assert train and train[-1].instances == 1
    assert all(m.change in ("", VARIABLES_MADE_CHANGE) for m in train)
    assert evaluation and evaluation[-1].instances == 1 and evaluation[0].traces == 1
    assert all(m.change in ("", VARIABLES_MADE_CHANGE) for m in evaluation)
    monitor = Monitor(lambda: 0.0)
    state, feed = monitor.state, monitor.feed
    for m in r.messages:
        monitor.take(m)
    monitor.evaluate(state.last_message_t, force=True)
    snap = monitor.snapshot(state.last_message_t)
    assert "retraces 0" in progress_line(snap)
    assert f"{name} (evaluation) 1 trace" in summary(snap)
    assert not [f for f in feed.engine.findings() if f.rule in ("retrace-storm", "function-recreated")]

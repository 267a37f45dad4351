"""The sample scripts' figures under the real agent equal what the scripts themselves do."""

from __future__ import annotations

import pytest

from tpuwatch.monitor.state import RunState
from tpuwatch.protocol import Step
from tpuwatch_testing import SAMPLES

pytestmark = [pytest.mark.tf, pytest.mark.slow]


def test_keras_fit_examples_per_s_stays_the_global_batch_times_steps_per_s(run_agent):
    # Issue 24: past the agent's first 256 reads, records carry "examples": null (reads are
    # paced); they were counted as steps of no examples (411 ex/s where ~830 were expected).
    # The default read pacing, not the tests' read-everything setting.
    r = run_agent(SAMPLES / "keras_fit.py", "--epochs", "2", "--steps-per-epoch", "170",
                  "--slow-input-after", "0", env={"TPUWATCH_LOSS_EVERY_S": ""}, timeout=300)
    assert r.returncode == 0, r.output[-2000:]
    steps = r.steps
    assert steps[-1].step == 340
    assert any(m.examples is None for m in steps), "reads were not paced: nothing reproduced"
    assert {m.examples for m in steps if m.examples is not None} == {128}  # the script's global batch
    state = RunState()
    checked = 0
    for m in r.messages:
        state.apply(m)
        if isinstance(m, Step) and m.step >= 280 and m.step % 20 == 0:
            snap = state.snapshot(now=m.t)
            assert snap.steps_per_s and snap.examples_per_s
            assert snap.examples_per_s == pytest.approx(128 * snap.steps_per_s, rel=0.02), m.step
            checked += 1
    assert checked >= 3

"""Bounded statistics: exact percentiles, bounded downsampled history, rates."""

from __future__ import annotations

import math
import sys

import pytest
from monitor_recordings import step

from tpuwatch.monitor.stats import History, StepStats, percentile
from tpuwatch.protocol import Step


def test_percentile_is_exact_on_a_known_series():
    v = list(range(1, 101))  # 1..100
    assert percentile(v, 50) == 50.5
    assert percentile(v, 95) == pytest.approx(95.05)
    assert percentile(v, 0) == 1 and percentile(v, 100) == 100
    assert percentile([3.0], 95) == 3.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_rolling_p50_p95_over_the_last_window_only():
    st = StepStats(window=100)
    # 50 slow records that fall out of the window, then 100 records of 1..100 ms (shuffled)
    for i in range(50):
        st.add(step(i + 1, float(i), step_time_s=9.0))
    order = [(k * 37) % 100 for k in range(100)]
    for j, k in enumerate(order):
        st.add(step(51 + j, 50.0 + j, step_time_s=(k + 1) / 1000))
    r = st.rolling()
    assert r.step_p50_s == pytest.approx(0.0505)
    assert r.step_p95_s == pytest.approx(0.09505)


def test_input_wait_share_and_rates():
    st = StepStats(window=200, rate_window_s=10.0)
    for i in range(1, 101):  # 10 steps/s, 0.1 s each, 25% waiting, 32 examples a step
        st.add(step(i, i * 0.1, step_time_s=0.1, wait=0.025, examples=32))
    r = st.rolling()
    assert r.steps_per_s == pytest.approx(10.0)
    assert r.examples_per_s == pytest.approx(320.0)


def test_rate_uses_the_recent_window_not_the_whole_run():
    st = StepStats(rate_window_s=5.0)
    t = 0.0
    for i in range(1, 101):  # 1 step/s for 100 s ...
        t += 1.0
        st.add(step(i, t, step_time_s=1.0))
    for i in range(101, 201):  # ... then 10 steps/s for 10 s
        t += 0.1
        st.add(step(i, t, step_time_s=0.1))
    assert st.rolling().steps_per_s == pytest.approx(10.0, rel=0.05)


def test_one_record_rate_is_its_own_step_time():
    st = StepStats()
    st.add(step(1, 1.0, wait=None))
    r = st.rolling()
    assert r.steps_per_s == pytest.approx(20.0)  # one record: 1 / its step time


def test_history_keeps_means_and_loss_band_when_merging():
    h = History(max_points=8)
    for i in range(1, 65):
        h.add(step(i, float(i), step_time_s=i / 1000, losses=(i, i + 1.0, i + 2.0, i + 3.0)))
    pts = h.points()
    assert len(pts) <= 8
    assert h.records_per_point == 16  # 64 records over at most 8 points
    assert pts[0].step == 16 and pts[-1].step == 64
    # first bucket covers steps 1..16
    assert pts[0].step_time_s == pytest.approx(sum(range(1, 17)) / 16 / 1000)
    assert pts[0].loss_min == 1 and pts[0].loss_max == 16 + 3.0
    assert pts[0].loss == pytest.approx(sum(i + 1.5 for i in range(1, 17)) / 16)


def test_history_skips_non_finite_losses_in_means_and_band():
    h = History(max_points=4)
    h.add(step(1, 1.0, losses=(1.0, math.nan, 3.0, 2.0)))
    (p,) = h.points()
    assert p.loss_min == 1.0 and p.loss_max == 3.0
    assert p.loss is None  # the mean loss of that record was nan


@pytest.mark.slow
def test_memory_stays_bounded_over_a_million_steps():
    st = StepStats(history_points=2000)
    proto = Step(step=0, t=0.0, step_time_s=0.05, input_wait_s=0.001, loss=0.5,
                 replica_losses=(0.5, 0.5, 0.5, 0.5), examples=64)
    for i in range(1, 1_000_001):
        st.add(Step(i, i * 0.05, 0.05, 0.001, 0.5, proto.replica_losses, 1, 64))
    h = st.history
    assert len(h) <= 2000
    assert h.records_per_point == 1024 // 2  # 1e6 records / 2000 points -> width 512
    assert len(h._open) < h.records_per_point
    assert len(st.recent()) == 200
    size = sys.getsizeof(h._closed) + sys.getsizeof(h._points) + sys.getsizeof(st._rate)
    assert size < 200_000
    pts = h.points()
    assert pts[-1].step == 1_000_000
    assert sum(1 for _ in pts) == len(h)


def test_examples_per_s_counts_records_without_examples_at_the_last_known_batch():
    # Once the agent paces its reads, records carry ``examples: null``; they are
    # steps of the same batch, not steps of no examples (the sample showed 411 ex/s for ~830).
    st = StepStats(window=200, rate_window_s=10.0)
    for i in range(1, 201):  # 10 steps/s, batch 128, every other record without its examples
        st.add(step(i, i * 0.1, step_time_s=0.1, examples=128 if i <= 20 or i % 2 else None))
    r = st.rolling()
    assert r.steps_per_s == pytest.approx(10.0)
    assert r.examples_per_s == pytest.approx(1280.0)


def test_examples_per_s_is_unknown_when_no_record_carries_examples():
    st = StepStats(rate_window_s=10.0)
    for i in range(1, 50):
        st.add(step(i, i * 0.1, step_time_s=0.1, examples=None))
    assert st.rolling().examples_per_s is None

"""One median and one mean loss (issue 24): every place that computes them uses the same one."""

from __future__ import annotations

import math

from monitor_recordings import mr, step

from tpuwatch.monitor.diagnostics.robust_stats import median
from tpuwatch.monitor.state import RunState
from tpuwatch.monitor.stats import percentile
from tpuwatch.ui.widgets.replica_loss_panel import replica_loss_text


def test_one_median_the_two_middle_values_averaged():
    v = [1.0, 2.0, 10.0, 20.0]
    assert median(v) == percentile(sorted(v), 50) == 6.0  # not the upper median, 10


def test_one_mean_loss_a_nan_replica_shows_in_the_header_the_panel_and_the_line():
    from tpuwatch.console.headless import summary

    s = RunState()
    s.apply(mr.hello())
    s.apply(mr.topology(mr.T0))
    s.apply(step(1, mr.T0 + 1, losses=(1.0, 2.0, math.nan, 3.0)))
    snap = s.snapshot(mr.T0 + 1)
    assert math.isnan(snap.loss)  # what the script's strategy.reduce(MEAN) prints
    assert "mean NaN" in replica_loss_text(snap, 10).plain  # was the finite replicas' 2
    assert "NaN, the mean over replicas" in summary(snap)  # one loss format: the panel's

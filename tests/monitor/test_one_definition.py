"""One median and one mean loss: every place that computes them uses the same one."""

from __future__ import annotations

import math

from monitor_recordings import mr, step

from tpuwatch import protocol
from tpuwatch.agent import auto_profile
from tpuwatch.agent.summary import SummaryBuilder
from tpuwatch.monitor.diagnostics.robust_stats import median
from tpuwatch.monitor.diagnostics.thresholds import Thresholds
from tpuwatch.monitor.state import RunState
from tpuwatch.monitor.stats import RunSteps, StepStats, percentile
from tpuwatch.protocol import Step
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


def test_one_quantile_the_agents_summary_and_the_viewers_figures_agree_to_the_bit():
    """Twenty steps of 12.3 ms each: p95 is 12.3 ms in the agent's summary, the rolling figure and
    the whole-run one. The viewer's copy (``lo * (1 - f) + hi * f``) read 0.012300000000000002
    where the agent's (``lo + (hi - lo) * f``, kept: exact when the neighbours are equal, never
    outside them) read 0.0123; both now call ``tpuwatch.figures.quantile``."""
    steps = [Step(step=i, t=100.0 + i * 0.0123, step_time_s=0.0123, input_wait_s=None, loss=None)
             for i in range(1, 21)]
    b = SummaryBuilder(0, clock=lambda: 200.0)
    for m in steps:
        b.feed(protocol.encode(m))
    (summary,) = [protocol.decode(x) for x in b.tick()]
    rolling, whole = StepStats(), RunSteps()
    for m in steps:
        rolling.add(m)
        whole.add(m)
    assert summary.step_time_p95_s == rolling.rolling().step_p95_s == whole.percentiles()[1] == 0.0123
    assert summary.step_time_p50_s == rolling.rolling().step_p50_s == whole.percentiles()[0] == 0.0123
    # the jitter rule's p50/p95 too: one function, no copy beside it
    import tpuwatch.agent.summary as agent_summary
    import tpuwatch.monitor.diagnostics.progress as jitter_rule
    from tpuwatch import figures

    assert agent_summary.quantile is jitter_rule.quantile is figures.quantile


def test_one_input_bound_threshold_the_agents_auto_profile_starts_where_the_rule_says_moderately():
    th = Thresholds()
    assert auto_profile.SHARE_FRAC == th.input_info_frac
    assert auto_profile.MIN_WAIT_S == th.input_min_wait_s


def test_one_duration_format_the_headless_line_writes_a_step_time_as_the_dashboard_does():
    """A step time is written one way (``units.duration``, the dashboard's): the headless line
    wrote 4.31 ms as "4.31 ms" where the Workers panel wrote "4.3 ms", 125 s as "125 s" where
    the panel wrote "2m05s", and an infinite time as "inf s"."""
    from tpuwatch import units
    from tpuwatch.console.headless import progress_line

    for step_time_s, text in ((0.00431, "4.3 ms"), (0.05, "50.0 ms"), (15.08, "15.08 s"), (125.0, "2m05s")):
        s = RunState()
        s.apply(mr.hello())
        s.apply(mr.topology(mr.T0))
        for i in range(1, 4):
            s.apply(step(i, mr.T0 + i * step_time_s, step_time_s=step_time_s))
        snap = s.snapshot(mr.T0 + 3 * step_time_s)
        assert units.duration(snap.step_p50_s) == text
        assert f"p50 {text} " in progress_line(snap), progress_line(snap)
    assert units.fmt_seconds(math.inf) == units.duration(math.inf) == units.UNKNOWN

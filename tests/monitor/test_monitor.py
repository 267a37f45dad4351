"""The one way a viewer takes a run's messages (``Monitor.take``) and the one way out
(``Monitor.snapshot``): the state, the findings and the step figures fed together, as the
headless view, the relay and the dashboard's reader now all do."""

from __future__ import annotations

from monitor_recordings import mr

from tpuwatch.monitor.monitor import Monitor
from tpuwatch.monitor.stats import percentile
from tpuwatch.protocol import Finding


def _input_bound(monitor: Monitor) -> list[Finding]:
    msgs = mr.input_bound_messages(300)
    for m in msgs:
        assert monitor.take(m)
    return monitor.evaluate(msgs[-1].t, force=True)


def test_a_finding_of_its_own_read_back_is_skipped_and_the_figures_are_the_records():
    recorded: list[Finding] = []
    monitor = Monitor(clock=lambda: 0.0, on_new=recorded.extend)
    new = _input_bound(monitor)
    assert new and recorded == new  # handed over to be recorded
    before = monitor.snapshot(0.0).findings
    for f in recorded:  # the owner reads its own recording on: the lines come back
        assert not monitor.take(f)
    assert monitor.snapshot(0.0).findings == before
    times = sorted(m.step_time_s for m in mr.input_bound_messages(300) if m.kind == "step")
    assert len(monitor.steps.values) == len(times) == 300
    assert monitor.steps.percentiles() == (percentile(times, 50), percentile(times, 95))


def test_a_view_beside_the_owner_takes_no_recorded_finding_but_an_other_viewer_does():
    owner = Monitor(clock=lambda: 0.0)
    (f, *_) = _input_bound(owner)
    beside = Monitor(clock=lambda: 0.0, recorded_findings=False, step_figures=False)
    other = Monitor(clock=lambda: 0.0)
    for m in (mr.hello(), f):
        beside.take(m)
        other.take(m)
    assert beside.steps is None
    assert [x.rule for x in other.snapshot(0.0).findings] == [f.rule]
    assert beside.snapshot(0.0).findings == ()


def test_the_step_figures_of_a_group_come_from_one_worker():
    from monitor_recordings import step

    monitor = Monitor(clock=lambda: 0.0, steps_of="worker:0")
    for worker in ("worker:0", "worker:1"):
        monitor.take(mr.hello(worker=worker), worker)
        for i in range(1, 11):
            monitor.take(step(i, mr.T0 + i, step_time_s=0.1 if worker == "worker:0" else 0.3), worker)
    assert len(monitor.steps.values) == 10 and monitor.steps.percentiles() == (0.1, 0.1)

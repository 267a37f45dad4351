"""straggler-host: a worker that is an outlier among several."""

from diag_synthetic import SyntheticRun, findings


def workers_with_wait(slow_wait_s: float, workers: int = 4, n: int = 200):
    run = SyntheticRun(workers=workers, local_replicas=1, step_time_s=0.05, seed=3)
    # healthy workers wait ~2 ms, with per-worker jitter
    run.steps(5, step_time_s=2.0)
    run.steps(n, input_wait_s=lambda s, w: slow_wait_s if w == workers - 1
              else 0.002 + 0.0003 * ((s * (w + 3)) % 5))
    return run.engine()


def test_input_wait_straggler_threshold():
    # floor: 5 ms over the others (10 % of a 50 ms step is also 5 ms)
    assert findings(workers_with_wait(0.0066), "straggler-host") == []
    (f,) = findings(workers_with_wait(0.0078), "straggler-host")
    assert f.severity == "warning"
    assert f.worker == "host3:103" and f.evidence["straggler_worker"] == "host3:103"
    assert f.evidence["metric"] == "input_wait"
    assert "host3" in f.advice and "shards" in f.advice


def test_two_workers_use_a_ratio():
    (f,) = findings(workers_with_wait(0.030, workers=2), "straggler-host")
    assert f.worker == "host1:101"
    assert findings(workers_with_wait(0.0025, workers=2), "straggler-host") == []


def test_step_time_straggler():
    run = SyntheticRun(workers=3, local_replicas=1, step_time_s=0.05)
    run.steps(5, step_time_s=2.0)
    run.steps(200, worker_step_time=lambda s, w: 0.07 if w == 1 else 0.05)
    (f,) = findings(run.engine(), "straggler-host")
    assert f.worker == "host1:101" and f.evidence["metric"] == "step_time"
    assert f.evidence["excess_ms"] == 20


def test_single_worker_is_silent():
    assert findings(workers_with_wait(0.05, workers=1), "straggler-host") == []


def test_identical_workers_with_noise_are_silent():
    run = SyntheticRun(workers=4, local_replicas=2, step_time_s=0.05, time_noise=0.1, seed=11)
    run.steps(5, step_time_s=2.0)
    run.steps(500, input_wait_s=lambda s, w: 0.001 + 0.002 * ((s * 7 + w * 13) % 10) / 10)
    assert findings(run.engine(), "straggler-host") == []


def test_a_joining_straggler_is_judged_at_the_next_drain_not_a_second_later():
    """A pod's hosts join a viewer over seconds, each with a first summary of many steps: the one
    whose input wait stands out is named at the first drain half a second after the last
    evaluation, not a whole evaluation interval later (1,024 hosts: most of the viewer's own
    delay before the finding)."""
    from tpuwatch.monitor.diagnostics.feed import JOINED_EVALUATE_S, FindingsFeed
    from tpuwatch.monitor.state import RunState
    from tpuwatch.protocol import HostSummary

    t0 = 1_750_000_000.0

    def summary(worker: int, t: float) -> HostSummary:
        wait = 0.06 if worker == 3 else 0.002
        return HostSummary(t=t, offset_bytes=1000, records=100, steps=100, step=100, step_t=t,
                           function="train_step", step_time_p50_s=0.1, step_time_p95_s=0.1,
                           step_time_max_s=0.1, step_time_sum_s=10.0, input_wait_sum_s=100 * wait,
                           input_wait_steps=100, input_wait_p50_s=wait)

    state, feed = RunState(clock=lambda: t0), FindingsFeed(lambda: t0)
    for w in range(3):
        feed.apply(summary(w, t0), f"worker:{w}")
    feed.evaluate(state, t0)
    feed.apply(summary(3, t0 + 0.1), "worker:3")  # joins just after an evaluation
    assert feed.evaluate(state, t0 + 0.25) == []  # not before half a second
    new = feed.evaluate(state, t0 + JOINED_EVALUATE_S)
    assert [f.worker for f in new if f.rule == "straggler-host"] == ["worker:3"]
    # with no worker joining, once an interval as before
    feed.apply(summary(0, t0 + 1.2), "worker:0")
    assert feed.evaluate(state, t0 + 1.2) == [] and feed.evaluate(state, t0 + 1.4) == []

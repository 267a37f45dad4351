"""The engine as a whole: healthy runs stay quiet, recordings, the evaluate() contract, costs."""

from __future__ import annotations

import math
import time
import tracemalloc
from pathlib import Path

import pytest
from diag_synthetic import GiB, MiB, SyntheticRun, alarms, findings

from tpuwatch import protocol
from tpuwatch.monitor.diagnostics import RULE_IDS, Engine, Thresholds
from tpuwatch.protocol import Config, Step

DATA = Path(__file__).resolve().parents[1] / "data"


def healthy_run(workers: int = 1, local_replicas: int = 4, epochs: int = 3,
                steps_per_epoch: int = 1000, seed: int = 5) -> SyntheticRun:
    """A Keras-like healthy run: tracing warm-up, validation gaps at epoch boundaries, a
    partial last batch (one retrace per function), iterator restarts, GC spikes, an RSS
    warm-up plateau, per-replica loss noise."""

    def rss(dt: float) -> int:  # +400 MB warm-up over 40 s, then flat with a GC sawtooth
        return int(2 * GiB + 400 * MiB * min(dt / 40.0, 1.0) + (dt % 30.0) * 0.3 * MiB)

    run = SyntheticRun(workers=workers, local_replicas=local_replicas, seed=seed,
                       step_time_s=0.05, time_noise=0.08, loss_noise=0.03, rss_bytes=rss,
                       device_peak_bytes=10 * GiB, device_limit_bytes=16 * GiB,
                       config=Config(t=0.0, mixed_precision="float32", global_batch_size=64,
                                     total_steps=epochs * steps_per_epoch, epochs=epochs))
    rng = run.rng
    run.retrace("multi_step_on_iterator", 1, 1, "")
    for epoch in range(epochs):
        run.epoch_begin(epoch)
        if epoch == 0:
            run.steps(1, step_time_s=4.0, epoch=epoch)  # tracing + compile
            run.steps(2, step_time_s=0.4, epoch=epoch)
        run.steps(1, step_time_s=1.2, input_wait_s=1.1, epoch=epoch)  # shuffle buffer fill
        for _ in range(steps_per_epoch - (4 if epoch == 0 else 1) - 1):
            gc = rng.random() < 1 / 300
            run.steps(1, step_time_s=0.2 if gc else None, epoch=epoch, examples=64,
                      input_wait_s=lambda s, w: 0.05 * rng.uniform(0.005, 0.03),
                      function="multi_step_on_iterator")
        if epoch == 0:
            run.retrace("multi_step_on_iterator", 2, 1, "iterator: shape (64, 32) -> (None, 32)")
        run.steps(1, step_time_s=0.6 if epoch == 0 else None, epoch=epoch, examples=32,
                  function="multi_step_on_iterator")
        # validation: the test function (same name in Keras 3) traces on the first pass
        if epoch == 0:
            run.retrace("multi_step_on_iterator", 3, 2, "")
            run.retrace("multi_step_on_iterator", 4, 2, "iterator: shape (64, 32) -> (None, 32)")
        run.advance(25.0)
        run.epoch_end(epoch)
    run.advance(20.0)  # model.save
    run.exit(0)
    return run


def feed_live(run: SyntheticRun, eng: Engine) -> list[protocol.Finding]:
    """Feeds messages, evaluating once a second of run time like the dashboard."""
    shown: list[protocol.Finding] = []
    next_eval = None
    for msg, worker in run.msgs:
        eng.apply(msg, worker=worker)
        t = getattr(msg, "t", None)
        if t is None:
            continue
        if next_eval is None or t >= next_eval:
            shown += eng.evaluate(now=t)
            next_eval = t + 1.0
    run.msgs = []
    shown += eng.evaluate(now=run.t)
    return shown


def test_healthy_4_replica_run_has_no_alarms_live_or_in_report():
    run = healthy_run()
    msgs = list(run.msgs)
    live = Engine(clock=lambda: run.t)
    shown = feed_live(run, live)
    assert [f for f in shown if f.severity != "info"] == []
    report = Engine(clock=lambda: run.t + 3600)
    for msg, worker in msgs:
        report.apply(msg, worker=worker)
    assert alarms(report) == []


def test_healthy_multi_worker_run_has_no_alarms():
    run = healthy_run(workers=3, local_replicas=2, epochs=2, steps_per_epoch=600, seed=9)
    eng = Engine(clock=lambda: run.t)
    assert [f for f in feed_live(run, eng) if f.severity != "info"] == []


def test_healthy_short_run_has_no_findings_at_all():
    run = healthy_run(epochs=1, steps_per_epoch=40)
    eng = run.engine()
    assert findings(eng) == []


def replay(name: str, now: float | None = None) -> Engine:
    dec = protocol.Decoder()
    eng = Engine(clock=time.time)
    worker = ""
    for line in (DATA / name).read_bytes().splitlines():
        msg = dec.decode(line)
        if msg is None:
            continue
        if isinstance(msg, protocol.Hello):
            worker = msg.worker
        eng.apply(msg, worker=worker)
    return eng


def test_checked_in_recordings():
    assert alarms(replay("healthy_4replica.jsonl")) == []
    (f,) = alarms(replay("input_bound.jsonl"))
    assert f.rule == "input-bound" and f.severity == "warning"
    assert f.worker == "tpu-vm-0:4242"
    f, crash = alarms(replay("crashed.jsonl"))
    assert f.rule == "loss-nonfinite" and f.evidence["replica"] == 2
    assert f.first_step == 120
    # the script raised: its own line, no known signature
    assert crash.rule == "script-crash" and crash.evidence["signature"] == "unknown"
    assert crash.evidence["script_line"].startswith("train.py:41 in check_finite")
    # still running, last line torn: the report long after must not invent a stall
    assert alarms(replay("running_truncated.jsonl")) == []


def test_evaluate_returns_only_new_or_changed_findings():
    run = SyntheticRun()
    run.steps(100)
    eng = run.engine()
    assert eng.evaluate() == []
    run.steps(20, loss=lambda s, r, v: math.nan if r == 1 else v)
    run.feed(eng)
    (f,) = eng.evaluate()
    assert f.rule == "loss-nonfinite"
    run.steps(20, loss=lambda s, r, v: math.nan if r == 1 else v)
    run.feed(eng)
    assert eng.evaluate() == []  # same severity and message: not new
    assert [x.rule for x in eng.findings()] == ["loss-nonfinite"]
    assert eng.findings()[0].last_step == 140  # but the current set is up to date
    run.steps(20, loss=lambda s, r, v: math.nan if r in (1, 3) else v)
    run.feed(eng)
    (g,) = eng.evaluate()  # the message now names replica 3 too
    assert "3" in g.message and g.first_step == 101


def test_findings_are_ordered_worst_first_and_well_formed():
    run = SyntheticRun(is_tpu=True, device_limit_bytes=GiB, device_peak_bytes=int(0.95 * GiB))
    run.steps(100, loss=lambda s, r, v: math.inf if s > 90 else v)
    eng = run.engine()
    fs = findings(eng)
    assert [f.severity for f in fs] == ["critical", "warning", "info"]
    for f in fs:
        assert f.rule in RULE_IDS and "\n" not in f.message and f.advice
        assert all(isinstance(v, (int, float, str)) for v in f.evidence.values())
        assert protocol.decode(protocol.encode(f)) == f  # travels on the wire as is


def test_overrides_and_bad_names():
    assert Engine(stall_min_s=120).thresholds.stall_min_s == 120
    base = Thresholds(input_warning_frac=0.3)
    assert Engine(thresholds=base, stall_min_s=5).thresholds.input_warning_frac == 0.3
    with pytest.raises(TypeError, match="unknown diagnostics threshold.*stal_min_s"):
        Engine(stal_min_s=1)
    run = SyntheticRun()
    run.steps(50)
    run.advance(20.0)
    assert findings(run.engine(stall_min_s=10), "stall")


def steady_steps(n: int, start: int = 0):
    t = 1_750_000_000.0
    for i in range(start, start + n):
        yield Step(step=i + 1, t=t + i * 0.01, step_time_s=0.01 * (1 + (i % 7) / 50),
                   input_wait_s=0.0002, loss=1.0, replica_losses=(1.0, 1.01, 0.99, 1.0),
                   examples=64, function="train_step", epoch=i // 10000)


def test_a_steady_run_raises_no_finding():
    """50,000 steady steps (step time within 12%, balanced replicas, no input wait): nothing to
    say. What apply and evaluate cost is measured by bench/model_costs.py."""
    eng = Engine(clock=lambda: 0.0)
    for m in steady_steps(50_000):
        eng.apply(m, worker="h:1")
    eng.evaluate(now=0.0)
    assert eng.findings() == []


def test_memory_is_bounded_over_a_long_run():
    # after the windows have filled, more steps must not allocate more (a per-step leak of a
    # single byte would show as 60 kB here)
    eng = Engine(clock=lambda: 0.0)
    tracemalloc.start()
    for m in steady_steps(20_000):
        eng.apply(m, worker="h:1")
    eng.evaluate(now=0.0)
    before = tracemalloc.take_snapshot()
    for m in steady_steps(60_000, start=20_000):
        eng.apply(m, worker="h:1")
    eng.evaluate(now=0.0)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename")
                if "diagnostics" in s.traceback[0].filename)
    assert grown < 16 * 1024, f"diagnostics grew by {grown} bytes over 60k steps"


def test_odd_values_never_crash_the_engine():
    eng = Engine(clock=lambda: 0.0)
    eng.apply(protocol.HostSample(t=1.0, rss_bytes=1 << 200, available_bytes=-1, total_bytes=0,
                                  cpu_percent=math.nan), worker="h:1")
    eng.apply(protocol.DeviceSample(t=1.0, device="d", current_bytes=0, peak_bytes=10,
                                    limit_bytes=0), worker="h:1")
    for i in range(600):
        eng.apply(Step(step=i + 1, t=1.0 + i, step_time_s=math.inf if i % 7 == 0 else 0.0,
                       input_wait_s=math.nan, loss=None, replica_losses=(), steps=0),
                  worker="h:1")
    eng.apply(protocol.Retrace(t=2.0, function="", traces=0, instances=0, signature="",
                               change="shape (1,) -> ("), worker="h:1")
    assert [f.rule for f in alarms(eng, now=2000.0)] == []

"""Rendering as pure functions of a snapshot: no app needed."""

from __future__ import annotations

import math

import pytest

from tpuwatch import units
from tpuwatch.monitor.snapshot import (
    DeviceMemory,
    HostMemory,
    ReplicaLoss,
    RunSnapshot,
    StepPoint,
)
from tpuwatch.protocol import Finding
from tpuwatch.ui.widgets.findings_panel import findings_text
from tpuwatch.ui.widgets.history_bars import BarSeries, bar_rows, bucket, render_series
from tpuwatch.ui.widgets.input_panel import input_level, input_text, wait_series
from tpuwatch.ui.widgets.memory_panel import memory_text
from tpuwatch.ui.widgets.replica_loss_panel import pick_rows, replica_loss_text
from tpuwatch.ui.widgets.run_header import header_text, progress_parts, status_text
from tpuwatch.ui.widgets.step_time_panel import step_series

GiB = 1 << 30


def test_units() -> None:
    assert units.duration(0.0123) == "12.3 ms"
    assert units.duration(0.00085) == "850 µs"
    assert units.duration(125) == "2m05s"
    assert units.duration(None) == units.duration(math.nan) == "—"
    assert units.clock(3723) == "1:02:03" and units.clock(65) == "1:05"
    assert units.size(1536) == "1.50 KiB" and units.size(16 * GiB) == "16.0 GiB"
    assert units.count(4100) == "4.10k" and units.count(12.5) == "12.5" and units.count(2_500_000) == "2.5M"
    assert units.loss(math.nan) == "NaN" and units.loss(-math.inf) == "-Inf" and units.loss(0.69314) == "0.6931"
    assert units.signed(0.0012) == "+0.0012" and units.signed(-1.3e-5) == "-1.3e-05"
    assert units.percent(0.075) == "7.5%" and units.percent(0.8) == "80%"


def test_bucket_right_aligns_short_series_and_shares_the_axis() -> None:
    assert bucket([1.0, 2.0], 4) == [None, None, 1.0, 2.0]
    values = [float(i) for i in range(100)]
    waits = [0.1] * 100
    a, b = bucket(values, 10, "max"), bucket(waits, 10, "mean")
    assert len(a) == len(b) == 10
    assert a[0] == 9.0 and a[-1] == 99.0  # each column is the same 10 records in both series


def test_bucket_keeps_non_finite_visible() -> None:
    cols = bucket([1.0] * 50 + [math.nan] + [1.0] * 49, 10, "mean")
    assert sum(1 for c in cols if c is not None and math.isnan(c)) == 1


def test_bar_rows_scale_and_marks() -> None:
    rows = bar_rows([0.0, 0.5, 1.0, None, math.inf], height=2, lo=0.0, hi=1.0)
    assert rows == ["  █  ", "▁██ ×"]  # any measured value shows at least a sliver


def test_render_series_labels_scale_and_name() -> None:
    text = str(render_series(BarSeries((1.0, 2.0, 3.0), 0.0, 3.0, name="step", top_label="3ms"), 20, 3))
    lines = text.split("\n")
    assert len(lines) == 3 and lines[0].startswith("   3ms ") and lines[2].startswith("  step ")
    assert "no data yet" in str(render_series(None, 20, 1))


def test_step_series_clips_compile_spike() -> None:
    history = tuple(StepPoint(step=i, t=i, step_time_s=5.0 if i == 0 else 0.05, input_wait_s=0.01, loss=1.0)
                    for i in range(50))
    snap = RunSnapshot(history=history, step_p50_s=0.05, step_p95_s=0.05)
    series = step_series(snap)
    # The 5 s first step is out of the scale (marked); 1.5 x p50 of headroom over the rest.
    assert series.hi == pytest.approx(0.075) and series.marked == (0,)
    waits = wait_series(snap)
    assert waits.values[1] == pytest.approx(0.2) and waits.hi == 1.0


def test_input_verdict_is_the_findings_own() -> None:
    from tpuwatch.monitor.diagnostics import Thresholds
    from tpuwatch.monitor.diagnostics.input_share import InputTotals

    def snap(wait_s: float, step_s: float, n: int = 40) -> RunSnapshot:
        tot = InputTotals()
        for i in range(n):
            tot.add(i, step_s, wait_s, 1)
        share = tot.share(Thresholds())
        return RunSnapshot(step_time_s=step_s, input_wait_frac=share.share, input_wait=share, input_recent=share)

    # xprof's 5 % / 20 % of step time, fast steps included (a 10 ms step waiting 3 ms is 30 %);
    # only a wait under 0.1 ms per step is noise
    assert [input_level(snap(w, 0.1)) for w in (0.001, 0.006, 0.0199, 0.021)] == ["low", "moderate", "moderate", "high"]
    assert input_level(snap(0.003, 0.010)) == "high"
    assert input_level(snap(0.0038, 0.0055)) == "high"
    assert input_level(snap(0.00005, 0.0002)) == "low"
    low = input_text(snap(0.00005, 0.0002)).plain
    assert "not input-bound (<0.1 ms/step)" in low
    assert "not input-bound (<5%)" in input_text(snap(0.001, 0.1)).plain
    assert input_level(snap(0.02, 0.03, n=15)) == "unknown"  # 14 steps judged: too few
    assert input_level(RunSnapshot(step_time_s=0.1, input_wait_frac=0.5)) == "unknown"  # not evaluated yet
    text = input_text(snap(0.02, 0.031)).plain
    assert "65%" in text and "highly input-bound" in text and "mean 20.0 ms of 31.0 ms per step · 39 steps" in text


def test_status_badges_carry_meaning_without_colour() -> None:
    assert status_text(RunSnapshot(status="crashed", exit_code=1))[0].strip() == "CRASHED exit 1"
    assert status_text(RunSnapshot(status="crashed", exit_code=137, exit_signal=9))[0].strip() == "CRASHED SIGKILL"
    stalled = RunSnapshot(status="stalled", last_step_t=100.0, now=142.0)
    assert status_text(stalled)[0].strip() == "STALLED 0:42"


def test_header_drops_least_important_facts_when_narrow() -> None:
    snap = RunSnapshot(script="train.py", status="running", step=1234, total_steps=5000, epoch=1, epochs=4,
                       started_t=0.0, now=754.0, steps_per_s=12.5, examples_per_s=800.0, eta_s=300.0)
    parts = progress_parts(snap)
    assert parts == ["step 1,234/5,000 (24%)", "epoch 2/4", "12:34", "12.5 steps/s", "800 ex/s", "ETA 5:00"]
    narrow = str(header_text(snap, 40)).split("\n")[1]
    assert narrow == "step 1,234/5,000 (24%) · epoch 2/4"
    assert all(len(line) <= 40 for line in str(header_text(snap, 40)).split("\n"))


def replicas(n: int, nan_at: int | None = None) -> tuple[ReplicaLoss, ...]:
    out = []
    for i in range(n):
        loss = math.nan if i == nan_at else 1.0 + 0.01 * i
        out.append(ReplicaLoss(index=i, device=f"/job:worker/replica:0/task:{i // 8}/device:TPU:{i % 8}",
                               worker="w", loss=loss, deviation=0.0 if i == nan_at else 0.01 * i - 0.15,
                               finite=i != nan_at, step=10))
    return tuple(out)


def test_replica_rows_when_they_do_not_fit() -> None:
    rows, hidden = pick_rows(replicas(32, nan_at=5), room=5)
    assert hidden == 28 and len(rows) == 4
    assert rows[0].index == 0 or any(r.index == 5 for r in rows)
    assert any(r.index == 5 for r in rows)  # the non-finite replica is never hidden
    assert units.short_device("/job:worker/replica:0/task:1/device:TPU:3") == "t1/TPU:3"
    text = str(replica_loss_text(RunSnapshot(replica_losses=replicas(32, nan_at=5)), rows=6))
    assert "NON-FINITE" in text and "… 28 more replicas" in text


def test_memory_shows_limits_and_note() -> None:
    snap = RunSnapshot(
        device_memory=(DeviceMemory(device="/device:TPU:0", worker="w", current_bytes=14 * GiB, peak_bytes=15 * GiB,
                                    limit_bytes=16 * GiB, source="tf", limit_source="chip table v4",
                                    duty_cycle_pct=None, t=0.0),),
        host_memory=(HostMemory(worker="w", rss_bytes=2 * GiB, available_bytes=12 * GiB, total_bytes=16 * GiB,
                                cpu_percent=50.0, t=0.0),),
        tpu_metrics_note="TPU runtime metrics unavailable: no libtpu metrics server on :8431",
    )
    text = str(memory_text(snap, rows=5, width=60))
    assert "TPU:0" in text and "peak 15.0 GiB/16.0 GiB 94%" in text
    assert "2.00 GiB RSS 12.0 GiB free of 16.0 GiB" in text
    assert text.endswith("no libtpu metrics server on :8431")


def test_findings_order_and_empty_state() -> None:
    assert str(findings_text(RunSnapshot(), rows=5)) == "No findings"
    f = [Finding(t=1.0, rule="a", severity="info", message="fyi", advice=""),
         Finding(t=2.0, rule="b", severity="critical", message="loss is NaN on replica 2", advice="lower the LR")]
    text = str(findings_text(RunSnapshot(findings=tuple(f)), rows=5)).split("\n")
    assert text[0].startswith("!!") and "replica 2" in text[0] and "lower the LR" in text[1] and "fyi" in text[2]


def _crashed_with_findings() -> RunSnapshot:
    # the tester's `tpuwatch run s2_fit.py --mirrored --spe 5`: the raw TF error, its diagnosis
    # (with the advice), and a warning
    diagnosis = Finding(t=5.0, rule="script-crash", severity="critical",
                        message="script crashed: steps_per_execution=5 under MirroredStrategy at s2_fit.py:31",
                        advice="Keras 3 fit with steps_per_execution > 1 under MirroredStrategy fails "
                               "(keras-team/keras#19246): use 1 there (keep > 1 on TPU) or a custom loop")
    warning = Finding(t=4.0, rule="input-bound", severity="warning",
                      message="highly input-bound: 36% of step time waiting for input",
                      advice="end the pipeline with .prefetch(tf.data.AUTOTUNE) " * 4)
    return RunSnapshot(exception="InvalidArgumentError: Graph execution error:\n\nDetected at node "
                                 "'StatefulPartitionedCall' defined at (most recent call last):\n  File ...",
                       findings=(warning, diagnosis))


def test_small_findings_panel_shows_the_worst_headline_and_counts_findings() -> None:
    snap = _crashed_with_findings()
    # the Findings body at 80x24: 36 columns, 4 rows
    text = findings_text(snap, rows=4, width=36)
    assert text.plain.startswith("!! script crashed: steps_per_execution=5")
    assert len(text.wrap(36)) <= 4  # rows on the screen
    lines = text.plain.split("\n")
    shown = sum(line.startswith(("!!", "! ")) for line in lines)
    assert lines[-1] == f"… {3 - shown} more: z expands"  # findings (and the crash line), not lines
    # two rows: the headline, cut, and the count
    assert findings_text(snap, rows=2, width=36).plain.split("\n") == [
        "!! script crashed: steps_per_execut…", "… 2 more: z expands"]
    # one row: still the worst headline
    (line,) = findings_text(snap, rows=1, width=36).plain.split("\n")
    assert line.startswith("!! script crashed")


def test_expanded_findings_put_the_diagnosis_before_the_raw_crash() -> None:
    text = findings_text(_crashed_with_findings(), rows=10_000, width=76).plain
    assert text.index("script crashed: steps_per_execution=5") < text.index("keras-team/keras#19246") \
        < text.index("crashed: InvalidArgumentError") < text.index("highly input-bound")


def test_lost_run_says_why() -> None:
    text = str(findings_text(RunSnapshot(status="lost", lost_reason="pid 42 vanished without an exit record"), rows=5))
    assert text.startswith("!! lost contact: pid 42 vanished")


def test_a_loss_left_behind_by_the_run_is_marked_stale() -> None:
    """A frozen loss was shown as current for 125 steps. A loss over two seconds behind the run
    says so; one a few steps behind (sampled every 10 ms) does not, nor one a second and a half
    behind (the agent reads them at least once a second of training, at the step that reaches
    it, and the host's time between steps is in the rate)."""
    from tpuwatch.ui.widgets.replica_loss_panel import replica_loss_text

    rows = tuple(ReplicaLoss(index=i, device=f"CPU:{i}", worker="w", loss=2.0 + i / 10, deviation=0.0,
                             finite=True, step=100) for i in range(4))
    base = RunSnapshot(now=0.0, status="running", replica_losses=rows, loss=2.15, loss_step=100, steps_per_s=50.0)
    from dataclasses import replace

    fresh = replica_loss_text(replace(base, step=103), 8).plain
    stale = replica_loss_text(replace(base, step=225), 8).plain
    assert "step 100" in fresh and "stale" not in fresh
    assert "stale" not in replica_loss_text(replace(base, step=175), 8).plain
    assert "step 100" in stale and "stale: no loss since" in stale


def test_a_long_script_path_gives_way_before_the_replicas_in_the_header():
    # CI, 2026-11-26 (a clone one directory deeper): at 100 columns the header read
    # "/tmp/cicheck2/main/sample_runs/keras_fit.py · MirroredStrategy · 4…  FINISHED": the
    # replica count was cut for the sake of the script's directories
    snap = RunSnapshot(script="/tmp/cicheck2/main/sample_runs/keras_fit.py", strategy="MirroredStrategy",
                       replicas=4, device_kind="CPU", host="vm", status="finished", exit_code=0)
    line = header_text(snap, 100).plain.splitlines()[0]
    assert "MirroredStrategy · 4× CPU · vm" in line and "keras_fit.py" in line, line
    assert len(line) <= 100
    narrow = header_text(snap, 60).plain.splitlines()[0]
    assert "keras_fit.py · MirroredStrategy · 4× CPU" in narrow and len(narrow) <= 60, narrow

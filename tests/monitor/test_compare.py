"""tpuwatch compare: figures side by side, the step-time difference with its interval, losses by
step, findings in one run only, setup differences, and what cannot be compared."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace

from monitor_recordings import DATA, mr, write_run

from tpuwatch.console import compare
from tpuwatch.console.report_model import DevicePeak, FindingRow, Memory, Report, RunInfo, Summary


def _copy(tmp_path, name: str, fixture: str):
    d = tmp_path / name
    d.mkdir()
    shutil.copy(DATA / fixture, d / "events.jsonl")
    return d


def _cli(*args: str):
    return subprocess.run([sys.executable, "-m", "tpuwatch", "compare", *map(str, args)],
                          capture_output=True, text=True, timeout=60)


def test_a_slower_run_is_named_with_how_much_and_the_interval(tmp_path):
    a, b = _copy(tmp_path, "a", "healthy_4replica.jsonl"), _copy(tmp_path, "b", "input_bound.jsonl")
    data = compare.compare([compare.load("A", a), compare.load("B", b)])
    (d,) = data["step_time_median_difference"]
    assert d["significant"] and d["ci95_low_s"] > 0 and d["ci95_low_s"] <= d["difference_s"] <= d["ci95_high_s"]
    figs = {r["label"]: r["figures"] for r in data["runs"]}
    # the figures are the report's own for each run
    assert figs["A"]["step_time_p50_s"] == compare.load("A", a).summary.step_time_p50_s
    # one median: the difference is that of the p50s shown
    assert (d["base_median_s"], d["other_median_s"]) == (figs["A"]["step_time_p50_s"], figs["B"]["step_time_p50_s"])
    assert figs["B"]["input_wait_share"] > 0.5 > figs["A"]["input_wait_share"]
    assert figs["A"]["examples_per_s"] == __import__("pytest").approx(64 * figs["A"]["steps_per_s"], rel=0.01)
    (only,) = data["findings_only_in_one"]
    assert only["only_in"] == "B" and only["rule"] == "input-bound"
    r = _cli(a, b)
    assert r.returncode == 0, r.stderr
    assert "A is faster, its median step 2.01x shorter than B's" in r.stdout and "95% CI" in r.stdout
    assert "no significant difference" not in r.stdout
    assert "Loss by step" in r.stdout and "(a = A, b = B; * = several)" in r.stdout
    assert "only in B (not A): [warning] input-bound" in r.stdout


def test_the_same_run_twice_shows_no_significant_difference(tmp_path):
    a, b = _copy(tmp_path, "a", "healthy_4replica.jsonl"), _copy(tmp_path, "b", "healthy_4replica.jsonl")
    r = _cli(a, b, "--format", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    (d,) = data["step_time_median_difference"]
    assert not d["significant"] and d["difference_s"] == 0
    assert "no significant difference" in d["text"]
    assert data["findings_only_in_one"] == [] and data["setting_differences"] == []
    md = _cli(a, b, "--format", "markdown").stdout
    assert md.startswith("# tpuwatch compare") and "| step time p50 |" in md and "no significant difference" in md


def test_what_cannot_be_compared_is_one_line_each_never_a_traceback(tmp_path):
    a = _copy(tmp_path, "a", "healthy_4replica.jsonl")
    crashed = _copy(tmp_path, "c", "crashed.jsonl")
    empty = write_run(tmp_path / "w", [mr.hello()])  # started, never stepped
    other = write_run(tmp_path / "o", [
        replace(mr.hello(run_id="other", script="other.py"), tf_version="2.16.2"),
        mr.topology(mr.T0, replicas=2, devices=mr.DEVICES[:2]),
        *mr.steps(40, t0=mr.T0 + 1)])
    r = _cli(a, crashed, empty, other)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    out = r.stdout
    assert "B crashed after 150 steps" in out
    assert "C has no training steps: its step time, speed and losses are not compared" in out
    assert "step time C vs A: not compared" in out
    assert "A and D run different scripts (train.py vs other.py)" in out
    assert "A has 4 replicas and D 2: a step is different work; compare examples/s, not step time" in out
    assert "TensorFlow: A 2.21.0" in out and "D 2.16.2" in out


def test_two_runs_drawn_from_one_distribution_show_no_significant_difference(tmp_path):
    # two recordings of the same script with different noise (seeds): the interval includes zero
    runs = []
    for i, seed in enumerate((11, 12)):
        msgs = [mr.hello(mr.T0), mr.topology(mr.T0), *mr.steps(300, t0=mr.T0 + 1, seed=seed)]
        runs.append(compare.load("AB"[i], write_run(tmp_path / f"r{i}", msgs)))
    (d,) = compare.compare(runs)["step_time_median_difference"]
    assert d["difference_s"] != 0 and d["ci95_low_s"] < 0 < d["ci95_high_s"]
    assert not d["significant"] and d["text"].endswith("no significant difference")
    assert "not between runs" in d["method"]


def test_bad_input_is_one_line_and_a_usage_exit(tmp_path):
    a = _copy(tmp_path, "a", "healthy_4replica.jsonl")
    one = _cli(a)
    assert one.returncode == 2 and one.stderr.strip().count("\n") == 0 and "at least two runs" in one.stderr
    missing = _cli(a, tmp_path / "nope")
    assert missing.returncode == 2 and missing.stderr.startswith("tpuwatch: run B (")
    assert "Traceback" not in missing.stderr


def test_wall_time_and_every_ledger_bucket_side_by_side_with_differences(tmp_path):
    # Compare shows the goodput ledger of each run: wall time and its buckets, each
    # the run's own report figure, with the difference against the first run.
    a, b = _copy(tmp_path, "a", "healthy_4replica.jsonl"), _copy(tmp_path, "b", "input_bound.jsonl")
    runs = [compare.load("A", a), compare.load("B", b)]
    data = compare.compare(runs)
    for run, row in zip(runs, data["runs"]):
        ledger = run.report.ledger
        assert row["figures"]["wall_time_s"] == ledger["wall_s"]
        assert row["figures"]["goodput"] == ledger["goodput"]
        for bucket, seconds in ledger["buckets_s"].items():
            assert row["figures"][f"ledger_{bucket}_s"] == seconds
    figs = {r["label"]: r["figures"] for r in data["runs"]}
    assert figs["B"]["ledger_input_wait_s"] > figs["A"]["ledger_input_wait_s"]
    text = _cli(a, b).stdout
    assert "goodput" in text and "input wait" in text
    # a bucket row carries both runs' seconds and their difference
    (row,) = [ln for ln in text.splitlines() if ln.strip().startswith("training (ideal)")]
    assert len(row.split()) >= 5, row


def _timed_run(tmp_path, name: str, step_time_s: float, seed: int):
    msgs = [mr.hello(mr.T0), mr.topology(mr.T0), *mr.steps(300, t0=mr.T0 + 1, step_time_s=step_time_s, seed=seed)]
    return write_run(tmp_path / name, msgs)


def test_max_regression_gates_on_the_median_and_its_interval(tmp_path):
    # B's steps are 20 % longer than A's (each jittered by +-5 %): past a 5 % bound, within 30 %,
    # and at 19 % the difference is past the bound but its interval reaches it: not proven
    a, b = _timed_run(tmp_path, "a", 0.050, 1), _timed_run(tmp_path, "b", 0.060, 2)
    slow = _cli(a, b, "--max-regression", "5")
    assert slow.returncode == 1, slow.stdout + slow.stderr
    last = slow.stdout.strip().splitlines()[-1]
    assert last.startswith("compare --max-regression 5%: REGRESSION: B's step-time median") and "95% CI +" in last
    assert _cli(a, b, "--max-regression", "30").stdout.strip().splitlines()[-1].endswith("within 30%")
    assert _cli(a, b, "--max-regression", "30").returncode == 0
    edge = _cli(a, b, "--max-regression", "19.9", "--format", "json")
    verdict = json.loads(edge.stdout)["gate"]
    assert verdict["ci95_low_pct"] < 19.9 < verdict["relative_pct"], verdict
    assert (edge.returncode, verdict["verdict"], verdict["exit_code"]) == (0, "ok", 0)
    assert "not a proven regression" in edge.stderr.strip()  # JSON on stdout, the line on stderr
    # faster is never a regression; the JSON carries the verdict
    fast = _cli(b, a, "--max-regression", "0", "--format", "json")
    assert fast.returncode == 0 and json.loads(fast.stdout)["gate"]["verdict"] == "ok"
    proven = json.loads(_cli(a, b, "--max-regression", "5", "--format", "json").stdout)["gate"]
    assert proven["verdict"] == "regression" and proven["exit_code"] == 1 and proven["ci95_low_pct"] > 5


def test_max_regression_refuses_what_it_cannot_judge_in_one_line(tmp_path):
    a, b = _timed_run(tmp_path, "a", 0.05, 1), _timed_run(tmp_path, "b", 0.05, 2)
    three = _cli(a, b, a, "--max-regression", "5")
    assert three.returncode == 2 and "exactly two runs" in three.stderr and three.stderr.count("\n") == 1
    negative = _cli(a, b, "--max-regression", "-1")
    assert negative.returncode == 2 and "a percentage of 0 or more" in negative.stderr
    empty = write_run(tmp_path / "w", [mr.hello()])
    r = _cli(a, empty, "--max-regression", "5")
    assert r.returncode == 2 and r.stdout.strip().splitlines()[-1].endswith("has fewer than 2 step records")


def _report(findings: list[dict], rss: int, device: int) -> Report:
    """A finished run of 10 steps with these findings and memory peaks, nothing else known."""
    run = RunInfo(id="r", dir="", script="train.py", argv=[], host="", status="finished", strategy="",
                  strategies=[], replicas=None, device_kind="", devices=[], num_workers=1, tf_version="",
                  keras_version="", mixed_precision=None, global_batch_size=None, start=None, end=None,
                  duration_s=None, exit_code=None, exit_signal=None, exception=None, traceback="", lost_reason=None)
    summary = Summary(
        steps=10, step_records=10, total_steps=None, step_time_p50_s=None, step_time_p95_s=None, steps_per_s=None,
        examples_per_s=None, input_wait_share=None, input_wait=None, last_loss=None, keras_epoch_loss=None,
        retraces=[], memory=Memory(devices=[DevicePeak(worker="", device="CPU:0", peak_bytes=device, limit_bytes=None)],
                                   host_rss_peak_bytes=rss, tpu_metrics_note=""),
        replica_losses=[], commands=[], truncated_tail=False, recording_gaps=[], dropped_bytes=0, malformed_lines=0,
        unknown_lines=0, messages=0, disabled_probes={})
    rows = [FindingRow(rule=f["rule"], severity=f["severity"], message=f["message"], evidence=f["evidence"], advice="",
                       first_step=None, last_step=None, worker=f.get("worker", ""), t=0.0) for f in findings]
    return Report(run=run, summary=summary, pipelines=[], findings=rows, ledger={})


def test_memory_peaks_and_a_finding_that_changed_severity_and_size_are_shown(tmp_path):
    leak = {"rule": "host-memory-growth", "severity": "critical", "message": "grows", "worker": "h:1",
            "evidence": {"mib_per_step": 83}}
    fixed = {**leak, "severity": "warning", "evidence": {"mib_per_step": 3.1}}
    jitter = {"rule": "step-time-jitter", "severity": "info", "message": "p95", "evidence": {"p95_over_p50": 2.1}}
    runs = [compare.RunData("A", _report([leak, jitter], int(6.82 * 2**30), 2**20)),
            compare.RunData("B", _report([fixed, jitter], int(1.54 * 2**30), 2**20))]
    data = compare.compare(runs)
    (changed,) = data["findings_changed"]  # the jitter finding did not change
    assert changed["text"] == "host-memory-growth critical +83 MiB/step -> warning +3.1 MiB/step"
    assert data["findings_only_in_one"] == []
    figs = {r["label"]: r["figures"] for r in data["runs"]}
    assert (figs["A"]["host_rss_peak_bytes"], figs["B"]["device_peak_bytes"]) == (int(6.82 * 2**30), 2**20)
    text = compare.render_text(data)
    (row,) = [ln for ln in text.splitlines() if ln.strip().startswith("host RSS peak")]
    assert row.split()[3:] == ["6.82", "GiB", "1.54", "GiB", "-5.28", "GiB", "(-77%)"], row
    assert "Findings that changed\n  host-memory-growth critical +83 MiB/step -> warning +3.1 MiB/step (A -> B)" in text
    assert "the runs have the same findings, which changed as above" in text

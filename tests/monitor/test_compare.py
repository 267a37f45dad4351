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
    assert figs["A"]["step_time_p50_s"] == compare.load("A", a).summary["step_time_p50_s"]
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
        ledger = run.report["ledger"]
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

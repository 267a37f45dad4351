"""tpuwatch report (JSON shape, text, markdown) and tpuwatch ls (tail-only states)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest
from monitor_recordings import DATA, mr, write_run

from tpuwatch import rundir
from tpuwatch.console import report
from tpuwatch.monitor.recording import read_all
from tpuwatch.monitor.runs import list_runs
from tpuwatch.protocol import Exit, Finding, Step

RUN_KEYS = {"id", "dir", "script", "argv", "host", "status", "strategy", "replicas", "device_kind",
            "devices", "num_workers", "tf_version", "keras_version", "mixed_precision",
            "global_batch_size", "start", "end", "duration_s", "exit_code", "exit_signal",
            "exception", "lost_reason"}
SUMMARY_KEYS = {"steps", "step_records", "total_steps", "step_time_p50_s", "step_time_p95_s",
                "steps_per_s", "examples_per_s", "input_wait_share", "last_loss", "keras_epoch_loss", "retraces", "memory",
                "replica_losses", "commands", "truncated_tail", "dropped_bytes", "malformed_lines",
                "unknown_lines", "messages", "disabled_probes"}
FINDING_KEYS = {"rule", "severity", "message", "evidence", "advice", "first_step", "last_step",
                "worker", "t"}


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def run_from(tmp_path, name: str, **kw):
    d = tmp_path / name.removesuffix(".jsonl")
    d.mkdir()
    (d / "events.jsonl").write_bytes((DATA / name).read_bytes())
    if kw.get("meta") is not None:
        from tpuwatch import rundir

        rundir.write_meta(d, kw["meta"])
    return d


def test_report_json_shape_and_numbers(tmp_path):
    rep = report.build_report(run_from(tmp_path, "crashed.jsonl"))
    assert set(rep) == {"run", "summary", "pipelines", "findings", "ledger"}
    assert RUN_KEYS <= set(rep["run"]) and SUMMARY_KEYS <= set(rep["summary"])
    run, s = rep["run"], rep["summary"]
    assert run["status"] == "crashed" and run["exit_code"] == 1
    assert run["exception"].startswith("FloatingPointError") and run["replicas"] == 4
    assert run["duration_s"] == pytest.approx(10.18, abs=0.01)
    # whole-run percentiles from every step time of the recording
    times = sorted(m.step_time_s for m in read_all(DATA / "crashed.jsonl")[0]
                   if type(m).__name__ == "Step")
    assert s["step_time_p50_s"] == pytest.approx((times[74] + times[75]) / 2)
    assert s["steps"] == 150 and s["steps_per_s"] == pytest.approx(20, rel=0.05)
    assert s["input_wait_share"] == pytest.approx(0.03, rel=0.01)
    assert s["retraces"][0]["name"] == "train_step" and s["retraces"][0]["traces"] == 2
    assert s["memory"]["host_rss_peak_bytes"] == 2 * mr.GiB
    assert len(s["memory"]["devices"]) == 4
    assert s["last_loss"] == "NaN"  # non-finite as on the wire: the JSON stays strict
    assert [r["finite"] for r in s["replica_losses"]] == [True, True, False, True]
    assert all(FINDING_KEYS <= set(f) for f in rep["findings"])
    assert "loss-nonfinite" in {f["rule"] for f in rep["findings"]}  # re-run by the engine
    # strict JSON (allow_nan=False would raise), rendered from the model the dict came from
    assert json.loads(report.render_json(report.build_model(tmp_path / "crashed"))) == rep
    assert json.loads(json.dumps(rep)) == rep


def test_report_merges_recorded_findings(tmp_path):
    msgs = mr.healthy_messages(50)
    f = Finding(t=msgs[-1].t, rule="recorded-rule", severity="info", message="from the recording",
                advice="none needed", evidence={"k": 1}, first_step=3, last_step=9)
    d = write_run(tmp_path / "r", msgs[:-1] + [f, msgs[-1]])
    rep = report.build_report(d)
    (rec,) = [x for x in rep["findings"] if x["rule"] == "recorded-rule"]
    assert rec["evidence"] == {"k": 1} and rec["first_step"] == 3 and rec["last_step"] == 9


def test_report_of_a_truncated_dead_run_is_lost(tmp_path):
    d = run_from(tmp_path, "running_truncated.jsonl",
                 meta={"run_id": "r1", "script": "train.py", "child_pid": dead_pid(),
                       "started": mr.T0})
    model = report.build_model(d)
    rep = model.as_json()
    assert rep["run"]["status"] == "lost"
    assert rep["summary"]["truncated_tail"] is True and rep["summary"]["dropped_bytes"] > 0
    text = report.render_text(model)
    assert "last line cut" in text and "lost" in text


def test_renderers(tmp_path):
    rep = report.build_model(run_from(tmp_path, "input_bound.jsonl"))
    text = report.render_text(rep)
    assert "status          finished (exit 0)" in text
    assert "input wait      80% of step time" in text
    assert "[warning] input-bound" in text and "advice:" in text
    md = report.render_markdown(rep)
    assert md.startswith("# tpuwatch report: 20250615-120000-train-ab12")
    assert "| input wait | 80% of step time (highly input-bound) |" in md
    assert "### WARNING: input-bound" in md and "**Advice:**" in md


def test_text_and_markdown_list_the_commands(tmp_path):
    """The commands a run was given (profile, checkpoint, stack dump) and where their results went:
    the JSON had them under summary.commands, the text and the markdown left them out."""
    from tpuwatch.protocol import Command, CommandState, Result

    msgs = mr.healthy_messages(60)
    t = msgs[-2].t
    asked = [
        Command(id="p1", action="profile", args={"steps": 5}),
        CommandState(t=t, id="p1", action="profile", state="running", step=40),
        Result(t=t + 0.4, id="p1", action="profile", ok=True, message="profile captured: 5 steps",
               details={"path": "/tmp/run/profiles/plugins/profile/2025_06_15_12_00_09", "step": 40}),
        Command(id="s1", action="stack_dump", args={}),
        Result(t=t + 0.5, id="s1", action="stack_dump", ok=True,
               message="stack dump written to /tmp/run/stacks/20250615-120010-s1.txt",
               details={"path": "/tmp/run/stacks/20250615-120010-s1.txt"}),
        Command(id="p2", action="profile", args={"logdir": "gs://nobucket/x"}),
        Result(t=t + 0.6, id="p2", action="profile", ok=False,
               message="gs://nobucket does not exist; create it or pick another --logdir"),
    ]
    d = write_run(tmp_path / "r", msgs[:-1] + asked + [msgs[-1]])
    rep = report.build_model(d)
    assert [c.action for c in rep.summary.commands] == ["checkpoint", "profile", "stack_dump", "profile"]
    text, md = report.render_text(rep), report.render_markdown(rep)
    for out in (text, md):
        assert "/tmp/run/checkpoints/ckpt-1" in out  # the checkpoint's path, from its details
        assert "/tmp/run/profiles/plugins/profile/2025_06_15_12_00_09" in out
        assert "/tmp/run/stacks/20250615-120010-s1.txt" in out
        assert "gs://nobucket does not exist; create it or pick another --logdir" in out
    assert "\nCommands\n" in text and "## Commands" in md
    cmd_lines = text.split("\nCommands\n")[1].split("\n\n")[0].splitlines()
    assert len(cmd_lines) == 4 and "failed" in cmd_lines[3]
    assert "checkpoint done" in cmd_lines[0] and "step 30" in cmd_lines[0]


def test_report_errors(tmp_path):
    with pytest.raises(report.ReportError, match="no run directory"):
        report.build_report(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(report.ReportError, match="not a tpuwatch run"):
        report.build_report(tmp_path / "empty")


def test_list_runs_states_from_meta_and_tail(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    run_from(root, "healthy_4replica.jsonl", meta={"run_id": "a", "script": "train.py",
                                                   "child_pid": dead_pid(), "started": 1.0})
    run_from(root, "crashed.jsonl", meta={"run_id": "b", "script": "train.py", "started": 2.0})
    # alive: this test process stands in for the training child
    run_from(root, "running_truncated.jsonl", meta={"run_id": "c", "script": "train.py",
                                                    "child_pid": __import__("os").getpid(),
                                                    "child_identity": rundir.process_identity(
                                                        __import__("os").getpid()),
                                                    "started": 3.0})
    write_run(root / "d", mr.healthy_messages(20)[:-1],  # no exit, child gone
              meta={"run_id": "d", "script": "other.py", "child_pid": dead_pid(), "started": 4.0})
    runs = list_runs(root)
    by = {r.id: r for r in runs}
    assert [r.id for r in runs] == ["d", "c", "b", "a"]  # newest first
    assert by["a"].state == "finished" and by["a"].steps == 300 and by["a"].exit_code == 0
    assert by["b"].state == "crashed" and by["b"].exit_code == 1 and by["b"].steps == 150
    assert by["c"].state == "running" and by["c"].steps == 200
    assert by["d"].state == "lost" and by["d"].script == "other.py" and by["d"].steps == 20
    assert list_runs(tmp_path / "nowhere") == []


def test_list_runs_reads_only_the_tail_of_a_big_recording(tmp_path):
    """A ~60 MB recording: ls must not decode it all (it reads the last 64 KiB)."""
    d = tmp_path / "big"
    d.mkdir()
    with open(d / "events.jsonl", "wb") as f:
        from tpuwatch import protocol

        f.write(protocol.encode(mr.hello()))
        line = protocol.encode(mr.Step(step=1, t=mr.T0, step_time_s=0.05, input_wait_s=None,
                                       loss=1.0))
        f.write(line * 200_000)
        f.write(protocol.encode(mr.Step(step=200_001, t=mr.T0 + 1, step_time_s=0.05,
                                        input_wait_s=None, loss=1.0)))
        f.write(protocol.encode(Exit(t=mr.T0 + 2, exit_code=0)))
    t = time.perf_counter()
    (info,) = list_runs(tmp_path)
    elapsed = time.perf_counter() - t
    assert info.steps == 200_001 and info.state == "finished" and info.script == "train.py"
    print(f"list_runs on a {(d / 'events.jsonl').stat().st_size >> 20} MiB recording: {elapsed * 1e3:.0f} ms")


def test_list_runs_finds_the_last_step_before_a_long_tail(tmp_path):
    """A finished 28-step run whose evaluation and predict wrote ~70 KB after its last step: ls
    read only the last 64 KiB and showed no step count."""
    from tpuwatch.protocol import Phase

    msgs, end = mr._training(28, input_wait_frac=0.02, step_time_s=0.05, seed=3)
    t = end + 0.1
    tail: list = []
    for calls in range(1, 400):  # evaluation, then predict, re-sent as they progress
        tail.append(Phase(t=t, phase="evaluating", since=end, step=28, calls=calls,
                          detail="test_step" if calls < 200 else "predict_step"))
        tail.extend(mr.samples(t, t))
        t += 0.5
    d = write_run(tmp_path / "long_tail", msgs + tail + [Exit(t=t, exit_code=0)],
                  meta={"run_id": "long_tail", "script": "train.py", "started": mr.T0})
    events = d / rundir.EVENTS
    last_step_at = events.read_bytes().rfind(b'{"kind":"step",')
    assert events.stat().st_size - last_step_at > 64 * 1024  # the shape reported: 69 KB after it
    (info,) = list_runs(tmp_path)
    assert info.state == "finished" and info.steps == 28


def test_markdown_traceback_holding_a_fence_stays_one_block(tmp_path):
    """An exception whose text holds a Markdown fence (a docstring or an f-string quoting code) must
    not end the report's code block early. Before: the fence was three backticks whatever the text."""
    d = run_from(tmp_path, "crashed.jsonl")
    events = d / "events.jsonl"
    text = events.read_text()
    assert "loss is nan at step 150" in text
    events.write_text(text.replace('raise FloatingPointError(', 'raise FloatingPointError(```\\n## not a heading\\n```'))
    md = report.render_markdown(report.build_model(d))
    block = md[md.index("## Traceback"):]
    fence = block.splitlines()[2]
    assert set(fence) == {"`"} and len(fence) > 3, fence
    body = block.split(fence)[1]
    assert "## not a heading" in body and "```" in body


def test_a_nan_between_two_reads_is_headed_with_the_steps_it_went_between(tmp_path):
    # Losses read on every 5th step (the agent's pace where a read is dear): finite at step 10,
    # NaN at step 15. The heading said "from step 15", the first step it was seen.
    msgs: list = [mr.hello(mr.T0), mr.topology(mr.T0)]
    for n in range(1, 21):
        read = n % 5 == 0
        value = 0.5 if n <= 10 else math.nan
        msgs.append(Step(step=n, t=mr.T0 + 1 + n * 0.1, step_time_s=0.1, input_wait_s=None,
                         loss=value if read else None, replica_losses=(value,) * 4 if read else ()))
    msgs.append(Exit(t=msgs[-1].t + 0.1, exit_code=0))
    md = report.render_markdown(report.build_model(write_run(tmp_path / "run", msgs)))
    assert "### CRITICAL: loss-nonfinite — steps 11-15" in md, md
    assert "between step 10 and step 15 (the steps between were not read)" in md


def test_a_share_just_under_a_threshold_never_reads_as_the_threshold(tmp_path):
    # a new user's tryout (2026-11-26): the report said "input wait 5% of step time (not
    # input-bound)" where the dashboard said "wait 4.5% ... not input-bound (<5%)"
    msgs = [mr.hello(mr.T0), mr.topology(mr.T0),
            *mr.steps(200, t0=mr.T0 + 1, step_time_s=0.1, input_wait_frac=0.0452)]
    msgs.append(Exit(t=msgs[-1].t + 0.1, exit_code=0))
    text = report.render_text(report.build_model(write_run(tmp_path / "run", msgs)))
    (line,) = [x for x in text.splitlines() if x.strip().startswith("input wait ") and "step time" in x]
    assert "4.5% of step time (not input-bound)" in line, line


def _keras_pipeline(dataset: int, use: str, elements: int | None):
    """A pipeline as the agent maps a Keras script's ``make_dataset(files)`` (or Keras' own for predict)."""
    from tpuwatch.protocol import Pipeline

    if use == "predict":
        return Pipeline(t=mr.T0 + dataset, dataset=dataset, consumer="iterator",
                        stages=("from_tensor_slices", "batch", "prefetch"), sites=("", "", ""),
                        settings=("", "batch_size=32, drop_remainder=False", "buffer_size=AUTOTUNE"),
                        code=("", "", ""), holds_bytes=(0, 0, -1), added_by=("keras", "keras", "keras"),
                        elements=1, tf_prefetch=True, use=use)
    return Pipeline(t=mr.T0 + dataset, dataset=dataset, consumer="experimental_distribute_dataset",
                    stages=("TFRecordDataset", "map", "batch", "prefetch"),
                    sites=("train.py:30", "train.py:31", "train.py:32", "train.py:33"),
                    settings=("num_parallel_reads=AUTOTUNE", "num_parallel_calls=AUTOTUNE",
                              "batch_size=64, drop_remainder=False", "buffer_size=AUTOTUNE"),
                    code=("ds = tf.data.TFRecordDataset(files, num_parallel_reads=AUTOTUNE)",
                          "ds = ds.map(parse, num_parallel_calls=AUTOTUNE)", "ds = ds.batch(64)",
                          "return ds.prefetch(AUTOTUNE)"),
                    holds_bytes=(0, 0, 0, -1), added_by=("", "", "", ""), elements=elements, tf_prefetch=True,
                    use=use)


def test_input_section_groups_identical_pipelines_and_says_what_each_is_for(tmp_path):
    """A Keras script's train, validation and test datasets from one function, then 13 predict calls:
    the Input pipeline section had 16 blocks, three identical ones with no label saying which was which."""
    msgs = mr.healthy_messages(40)
    pipes = [_keras_pipeline(1, "train", 28), _keras_pipeline(2, "validation", 4), _keras_pipeline(3, "test", 4),
             *(_keras_pipeline(n, "predict", 1) for n in range(4, 17))]
    d = write_run(tmp_path / "r", msgs[:3] + pipes + msgs[3:])
    rep = report.build_model(d)
    assert [p["use"] for p in rep.pipelines] == ["train", "validation", "test"] + ["predict"] * 13
    text = report.render_text(rep)
    section = text.split("\nInput pipeline\n")[1].split("\n\n")[0]
    heads = [line for line in section.splitlines() if line.startswith("  dataset")]
    assert heads == ["  datasets 1, 2, 3 (train, validation, test; experimental_distribute_dataset), "
                     "28, 4, 4 batches per pass",
                     "  datasets 4-16 (predict x13; iterator), 1 batch per pass"]
    assert section.count("train.py:31") == 1 and section.count(".from_tensor_slices(") == 1
    md = report.render_markdown(rep)
    assert "- datasets 4-16 (predict x13; iterator), 1 batch per pass" in md

"""Two MultiWorkerMirroredStrategy workers on localhost under ``tpuwatch run --workers 2``: real TF,
real processes, real collectives. One slowed run is shared by the merged-view tests; the kill test
runs its own group."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpuwatch import rundir
from tpuwatch.monitor.group import GroupReader, read_group, worker_dirs
from tpuwatch.monitor.state import RunState
from tpuwatch_testing import SAMPLES, child_env

pytestmark = pytest.mark.tf

SCRIPT = str(SAMPLES / "multi_worker.py")


def tpuwatch(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpuwatch", *args], capture_output=True, text=True,
                          timeout=timeout, env=child_env(), **kw)


@pytest.fixture(scope="module")
def slowed_group(tmp_path_factory):
    """45 steps, worker 1's input pipeline sleeping 60 ms a batch."""
    home = tmp_path_factory.mktemp("mh-home")
    run = home / "group"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "tpuwatch", "run", "--headless", "--every", "1", "--workers", "2", "--run-dir",
         str(run), SCRIPT, "--steps", "45", "--batch-per-worker", "16", "--slow-worker", "1", "--slow-ms", "60"],
        capture_output=True, text=True, timeout=150, env=child_env(TPUWATCH_HOME=str(home)))
    return run, proc, time.monotonic() - t0, home


def test_group_layout_and_exit(slowed_group):
    run, proc, took, _ = slowed_group
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = rundir.read_meta(run)
    assert meta["group"] is True and meta["state"] == "finished" and meta["exit_code"] == 0
    assert [(w["name"], w["state"], w["exit_code"]) for w in meta["workers"]] == [
        ("worker:0", "finished", 0), ("worker:1", "finished", 0)]
    for i in (0, 1):
        wdir = run / f"worker-{i}"
        for name in (rundir.EVENTS, rundir.OUTPUT, rundir.META):
            assert (wdir / name).is_file(), f"{wdir}/{name} missing"
        wmeta = rundir.read_meta(wdir)
        assert wmeta["worker_index"] == i and wmeta["group_run_id"] == meta["run_id"]
        # TF_CONFIG gave each worker its index in a two-worker cluster
        assert f"worker {i} of 2: 2 replicas in sync" in (wdir / rundir.OUTPUT).read_text()
    merged = (run / rundir.OUTPUT).read_text()
    assert "[0] worker 0 done: 45 steps" in merged and "[1] worker 1 done: 45 steps" in merged
    # headless: merged progress lines with a per-worker line, and the script's output on stdout
    assert "workers: worker:0 step" in proc.stderr and "worker:1 step 45" in proc.stderr
    assert "[1] worker 1 step   45" in proc.stdout
    print(f"two-worker group, 45 steps: {took:.1f} s")


def test_merged_state_has_both_workers_and_global_replicas(slowed_group):
    run, proc, _, _ = slowed_group
    workers = worker_dirs(run)
    state = RunState()
    reader = GroupReader(workers)
    for name, msg in reader.read_new() + reader.finish():
        state.apply(msg, name)
    snap = state.snapshot(state.last_message_t)
    assert [w.name for w in snap.workers] == ["worker:0", "worker:1"]
    assert all(w.status == "finished" and w.step == 45 and w.pid > 0 for w in snap.workers)
    assert snap.replicas == 2 and snap.num_workers == 2
    # Each worker sees only its own replica; the state gives them global indexes 0 and 1.
    assert [(r.index, r.worker, r.step) for r in snap.replica_losses] == [(0, "worker:0", 45), (1, "worker:1", 45)]
    assert all(r.finite and 0 < r.loss < 10 for r in snap.replica_losses)
    # replicas in sync = sum of the workers' local replicas, from real MWMS topology messages
    tagged, _ = read_group(workers)
    topos = {n: m for n, m in tagged if type(m).__name__ == "Topology"}
    assert sum(t.local_replicas for t in topos.values()) == topos["worker:0"].replicas == 2
    assert [topos[n].worker_index for n in ("worker:0", "worker:1")] == [0, 1]


def test_report_merges_workers_and_names_the_straggler(slowed_group):
    run, _, _, home = slowed_group
    out = tpuwatch("report", str(run), "--format", "json")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["run"]["status"] == "finished" and rep["run"]["exit_code"] == 0 and rep["run"]["num_workers"] == 2
    assert [(w["name"], w["status"], w["exit_code"], w["steps"], w["replicas"]) for w in rep["workers"]] == [
        ("worker:0", "finished", 0, 45, [0]), ("worker:1", "finished", 0, 45, [1])]
    assert [r["worker"] for r in rep["summary"]["replica_losses"]] == ["worker:0", "worker:1"]
    stragglers = [f for f in rep["findings"] if f["rule"] == "straggler-host"]
    assert stragglers, [f["rule"] for f in rep["findings"]]
    f = stragglers[0]
    assert f["worker"] == "worker:1" and f["evidence"]["straggler_worker"] == "worker:1"
    assert f["evidence"]["metric"] == "input_wait" and f["evidence"]["excess_ms"] > 20
    assert "worker:1" in f["message"]
    assert all(s["worker"] == "worker:1" for s in stragglers)
    # a single worker's directory is a complete run of its own
    one = json.loads(tpuwatch("report", str(run / "worker-1"), "--format", "json").stdout)
    assert one["run"]["status"] == "finished" and one["summary"]["steps"] == 45 and "workers" not in one
    text = tpuwatch("report", str(run)).stdout
    assert "Workers" in text and "worker:1 on" in text and "replicas 1" in text


def test_headless_printed_straggler_and_ls_lists_group(slowed_group):
    run, proc, _, home = slowed_group
    assert "straggler: worker worker:1 median input wait" in proc.stderr
    # `tpuwatch ls` lists $TPUWATCH_HOME/runs: link the group there
    (home / "runs").mkdir(exist_ok=True)
    os.symlink(run, home / "runs" / "group", target_is_directory=True)
    ls = subprocess.run([sys.executable, "-m", "tpuwatch", "ls"], capture_output=True, text=True, timeout=60,
                        env=child_env(TPUWATCH_HOME=str(home)))
    line = next(line for line in ls.stdout.splitlines() if line.startswith("group"))
    assert line.split()[1] == "finished" and " 45 " in line and "(2 workers)" in line, ls.stdout


def _script_line(text: str) -> str:
    (n,) = [i for i, line in enumerate(Path(SCRIPT).read_text().splitlines(), start=1) if line.strip() == text]
    return f"multi_worker.py:{n}"


def test_each_workers_pipeline_map_names_the_scripts_lines(slowed_group):
    """The map of each worker's dataset (its own dataset_fn call under
    distribute_datasets_from_function), each stage at the line of multi_worker.py that made it."""
    run, proc, _, _ = slowed_group
    assert proc.returncode == 0, proc.stderr[-3000:]
    source = _script_line("ds = tf.data.Dataset.from_tensor_slices((images, labels))")
    shard = _script_line("ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).cache()")
    shuffle = _script_line("ds = ds.shuffle(1024, seed=args.seed).repeat()")
    batch = _script_line("ds = ds.batch(ctx.get_per_replica_batch_size(global_batch), drop_remainder=True)")
    common = [("from_tensor_slices", source), ("shard", shard), ("cache", shard), ("shuffle", shuffle),
              ("repeat", shuffle), ("batch", batch)]
    tails = {0: [("prefetch", _script_line("return ds.prefetch(tf.data.AUTOTUNE)"))],  # the fast worker
             1: [("map", _script_line("return ds.map(slowed).with_options(options)")),  # the slowed one
                 ("with_options", _script_line("return ds.map(slowed).with_options(options)"))]}
    for i in (0, 1):
        events = [json.loads(line) for line in (run / f"worker-{i}" / rundir.EVENTS).read_text().splitlines()]
        (pipe,) = [m for m in events if m.get("kind") == "pipeline"]  # once, with its worker's stages
        assert pipe["consumer"] == "distribute_datasets_from_function"
        assert list(zip(pipe["stages"], pipe["sites"])) == common + tails[i], pipe
        assert not any(pipe["added_by"]), pipe  # the script shards itself: nothing added
        holds = dict(zip(pipe["stages"], pipe["holds_bytes"]))
        element = 28 * 28 * 4 + 8  # float32 image and int64 label
        assert holds["cache"] == 4096 // 2 * element and holds["shuffle"] == 1024 * element
        assert dict(zip(pipe["stages"], pipe["settings"]))["batch"] == "batch_size=16, drop_remainder=True"


def test_a_global_dataset_maps_what_tf_distribute_adds_at_the_distribute_line(tmp_path):
    """One global-batch pipeline through experimental_distribute_dataset; each worker's
    map has the script's stages at their lines, then the rebatch and auto-shard tf.distribute
    adds, named at the script's experimental_distribute_dataset line."""
    run = tmp_path / "global"
    proc = subprocess.run(
        [sys.executable, "-m", "tpuwatch", "run", "--headless", "--workers", "2", "--run-dir", str(run),
         SCRIPT, "--steps", "5", "--batch-per-worker", "16", "--global-dataset"],
        capture_output=True, text=True, timeout=150, env=child_env(TPUWATCH_HOME=str(tmp_path / "home")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    source = _script_line("ds = tf.data.Dataset.from_tensor_slices((images, labels)).cache()")
    batch = _script_line("ds = ds.shuffle(1024, seed=args.seed).repeat().batch(global_batch, drop_remainder=True)")
    distribute = _script_line(
        "dist_dataset = strategy.experimental_distribute_dataset(ds.with_options(options).prefetch(2))")
    script = [("from_tensor_slices", source), ("cache", source), ("shuffle", batch), ("repeat", batch),
              ("batch", batch), ("with_options", distribute), ("prefetch", distribute)]
    for i in (0, 1):
        events = [json.loads(line) for line in (run / f"worker-{i}" / rundir.EVENTS).read_text().splitlines()]
        (pipe,) = [m for m in events if m.get("kind") == "pipeline"]
        assert pipe["consumer"] == "experimental_distribute_dataset"
        stages = list(zip(pipe["stages"], pipe["sites"], pipe["added_by"]))
        assert [(s, site) for s, site, by in stages if not by] == script, pipe
        added = [(s, site) for s, site, by in stages[len(script):]]
        assert all(by for _, _, by in stages[len(script):]), pipe  # all after the script's are added
        assert {"rebatch", "autoshard"} <= {s for s, _ in added}, pipe
        assert {site for _, site in added} == {distribute}, pipe
        assert dict(zip(pipe["stages"], pipe["settings"]))["batch"] == "batch_size=32, drop_remainder=True"


def test_killed_worker_is_marked_and_the_other_is_stopped(tmp_path):
    run = tmp_path / "group"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpuwatch", "run", "--headless", "--workers", "2", "--worker-grace", "2",
         "--run-dir", str(run), SCRIPT, "--steps", "5000", "--batch-per-worker", "16"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        events = run / "worker-1" / rundir.EVENTS
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if events.is_file() and events.read_bytes().count(b'{"kind":"step"') >= 3:
                break
            time.sleep(0.2)
        else:
            pytest.fail("worker 1 recorded no steps in 90 s")
        pid = rundir.read_meta(run / "worker-1")["child_pid"]
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        ended_after = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 137, err[-3000:]
    # worker 0 ends by itself (the collective fails) or is stopped after the 2 s grace: either way
    # within grace + SIGINT/SIGTERM waits, not never.
    assert ended_after < 20, ended_after
    meta = rundir.read_meta(run)
    assert meta["state"] == "crashed" and meta["exit_code"] == 137
    ends = {w["name"]: w for w in meta["workers"]}
    assert ends["worker:1"]["exit_code"] == 137 and ends["worker:1"]["state"] == "crashed"
    assert isinstance(ends["worker:0"]["exit_code"], int) and ends["worker:0"]["state"] in ("crashed", "finished")
    rep = json.loads(tpuwatch("report", str(run), "--format", "json").stdout)
    by = {w["name"]: w for w in rep["workers"]}
    assert by["worker:1"]["status"] == "crashed" and by["worker:1"]["exit_code"] == 137
    assert by["worker:0"]["status"] in ("crashed", "finished")  # ended and recorded, not lost
    assert rep["run"]["exit_code"] == 137
    kill_record = [json.loads(ln) for ln in events.read_text().splitlines() if '"kind":"exit"' in ln]
    assert kill_record and kill_record[-1]["signal"] == 9 and kill_record[-1]["source"] == "launcher"
    assert re.search(r"worker:1 step \d+ p50 \S+ \S+ input \S+ \[crashed \(exit 137\)\]", err), err[-2000:]


def test_a_hang_inside_a_collective_names_the_worker_not_arrived_and_each_workers_line(tmp_path):
    """Worker 1 sleeps 20 s in its own Python after step 20; worker 0's next step waits for it in
    the all-reduce. The stacks each agent took by itself while it hung (4 s into the gap:
    TPUWATCH_STALL_STACKS_S) name worker 1's line, and worker 0 inside its step, waiting for it."""
    script = SAMPLES / "planted" / "stall_collective.py"
    run = tmp_path / "group"
    proc = subprocess.run(
        [sys.executable, "-m", "tpuwatch", "run", "--headless", "--workers", "2", "--run-dir", str(run),
         str(script), "--hang-seconds", "20"],
        capture_output=True, text=True, timeout=240,
        env=child_env(TPUWATCH_HOME=str(tmp_path / "home"), TPUWATCH_STALL_STACKS_S="4"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = script.read_text().splitlines()
    sleep_line = next(i for i, t in enumerate(lines, start=1) if t.strip() == "time.sleep(seconds)")
    step_line = next(i for i, t in enumerate(lines, start=1) if t.strip() == "loss = float(train_step(iterator))")
    rep = json.loads(tpuwatch("report", str(run), "--format", "json").stdout)
    stalls = {f["worker"]: f for f in rep["findings"] if f["rule"] == "stall"}
    assert set(stalls) == {"worker:0", "worker:1"}, rep["findings"]
    late, waiting = stalls["worker:1"], stalls["worker:0"]
    assert late["evidence"]["stalled_in"] == "script"
    assert late["evidence"]["waiting_at"] == f"waiting at stall_collective.py:{sleep_line}: time.sleep(seconds)"
    assert waiting["evidence"]["stalled_in"] == "step"
    assert f"stall_collective.py:{step_line}" in waiting["evidence"]["waiting_at"]
    assert waiting["evidence"]["not_arrived"] == (
        f"worker worker:1 waiting at stall_collective.py:{sleep_line}: time.sleep(seconds)")
    for i in (0, 1):  # taken by each agent while the hang lasted
        (dump,) = (run / f"worker-{i}" / "stacks").glob("*stall-after-step-20.txt")
        assert "no step for" in dump.read_text()

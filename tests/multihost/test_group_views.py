"""Merged views of a group directory without TF: synthetic recordings of two workers with two local
replicas each (what MWMS on two TPU hosts would send), through the group reader, the merged report,
headless follow, the replay source and the dashboard at 80x24 and 160x48."""

from __future__ import annotations

import asyncio
import io
import sys
from pathlib import Path

from tpuwatch import protocol, rundir
from tpuwatch.console.headless import follow_group
from tpuwatch.console.report import build_model, build_report, render_text
from tpuwatch.monitor.group import GroupReader, read_group, worker_dirs
from tpuwatch.monitor.runs import run_info
from tpuwatch.protocol import DeviceSample, Exit, Hello, HostSample, Step, Topology
from tpuwatch.sources.group_source import GroupSource, make_group_replay_source
from tpuwatch.sources.source import apply_worker_health
from tpuwatch.ui.app import TpuwatchApp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ui"))
from ui_support import FakeClock, screen_text  # noqa: E402

T0 = 1_700_000_000.0
STEPS = 80


def _messages(index: int, *, wait_s: float, exit_code: int | None, signal: int | None = None) -> list:
    name = f"worker:{index}"
    out = [
        Hello(protocol_version=protocol.PROTOCOL_VERSION, agent_version="0", run_id=f"g-worker-{index}", t=T0,
              pid=1000 + index, host=f"host{index}", worker=name, python_version="3.11", tf_version="2.21.0",
              keras_version="3.15", script="train.py", argv=("train.py",)),
        Topology(t=T0 + 0.1, strategy="MultiWorkerMirroredStrategy", replicas=4, local_replicas=2, num_workers=2,
                 worker_index=index, device_kind="CPU", devices=("CPU:0", "CPU:1"), is_tpu=False),
        HostSample(t=T0 + 0.2, rss_bytes=(600 + index) << 20, available_bytes=8 << 30, total_bytes=16 << 30,
                   cpu_percent=50.0),
        DeviceSample(t=T0 + 0.2, device="CPU:0", current_bytes=(10 + index) << 20, peak_bytes=20 << 20),
    ]
    for s in range(1, STEPS + 1):
        base = 2.0 - s * 0.01
        out.append(Step(step=s, t=T0 + 1 + s * 0.1, step_time_s=0.1, input_wait_s=wait_s, loss=base + index * 0.1,
                        replica_losses=(base + index * 0.1 - 0.01, base + index * 0.1 + 0.01), examples=32,
                        function="train_step"))
    if exit_code is not None:
        out.append(Exit(t=T0 + 2 + STEPS * 0.1, exit_code=exit_code, signal=signal,
                        source="launcher" if signal else "agent", reason="killed by SIGKILL" if signal else ""))
    return out


def make_group(tmp_path: Path, *, w1_exit: int | None = 137, w1_signal: int | None = 9,
               w1_wait: float = 0.06) -> Path:
    run = tmp_path / "g"
    rundir.create(run)
    rundir.write_meta(run, {"run_id": "g", "group": True, "script": "train.py", "argv": ["train.py"], "started": T0,
                            "state": "crashed", "exit_code": 137,
                            "workers": [{"name": f"worker:{i}", "index": i, "dir": f"worker-{i}"} for i in (0, 1)]})
    for i, (code, sig, wait) in enumerate([(143, None, 0.001), (w1_exit, w1_signal, w1_wait)]):
        wdir = rundir.create(run / f"worker-{i}")
        rundir.write_meta(wdir, {"run_id": f"g-worker-{i}", "child_pid": 999_999_0 + i,
                                 **({"exit_code": code} if code is not None else {})})
        msgs = _messages(i, wait_s=wait, exit_code=code, signal=sig)
        (wdir / rundir.EVENTS).write_bytes(b"".join(protocol.encode(m) for m in msgs))
        (wdir / rundir.OUTPUT).write_text(f"worker {i} says hi\n")
    (run / rundir.OUTPUT).write_text("[0] worker 0 says hi\n[1] worker 1 says hi\n")
    return run


def test_reader_tags_every_message_with_its_worker(tmp_path):
    run = make_group(tmp_path)
    workers = worker_dirs(run)
    assert [(w.name, w.path.name) for w in workers] == [("worker:0", "worker-0"), ("worker:1", "worker-1")]
    assert worker_dirs(run / "worker-0") is None  # a worker's own directory is a plain run
    r = GroupReader(workers)
    tagged = r.read_new()
    assert r.caught_up and len(tagged) == 2 * (STEPS + 5)
    assert {n for n, m in tagged if isinstance(m, Hello) and m.worker == n} == {"worker:0", "worker:1"}
    merged, stats = read_group(workers)
    ts = [m.t for _, m in merged]
    assert ts == sorted(ts) and stats.messages == len(merged) == len(tagged)


def test_report_merges_workers_with_global_replicas_and_the_straggler(tmp_path):
    run = make_group(tmp_path)
    rep = build_report(run)
    assert rep["run"]["id"] == "g" and rep["run"]["exit_code"] == 137 and rep["run"]["replicas"] == 4
    assert [(w["name"], w["host"], w["status"], w["exit_code"], w["replicas"]) for w in rep["workers"]] == [
        ("worker:0", "host0", "crashed", 143, [0, 1]), ("worker:1", "host1", "crashed", 137, [2, 3])]
    assert [(r["index"], r["worker"]) for r in rep["summary"]["replica_losses"]] == [
        (0, "worker:0"), (1, "worker:0"), (2, "worker:1"), (3, "worker:1")]
    # the job's loss: the mean over all four replicas, not worker 0's own mean
    assert abs(rep["summary"]["last_loss"] - (2.0 - STEPS * 0.01 + 0.05)) < 1e-9
    (f,) = [f for f in rep["findings"] if f["rule"] == "straggler-host"]
    assert f["worker"] == "worker:1" and f["evidence"]["metric"] == "input_wait"
    assert f["evidence"]["excess_ms"] == 59.0
    text = render_text(build_model(run))
    assert "worker:1 on host1 pid 1001: crashed (exit 137)" in text and "replicas 2,3" in text
    assert "replica 3 (worker:1 CPU:1)" in text
    # the goodput ledger: per worker and merged (each bucket the workers' mean), summing to wall time
    lg = rep["ledger"]
    assert set(lg["workers"]) == {"worker:0", "worker:1"}
    for one in (lg, *lg["workers"].values()):
        assert abs(sum(one["buckets_s"].values()) - one["wall_s"]) <= 1e-6 * one["wall_s"]
    w0, w1 = lg["workers"]["worker:0"]["buckets_s"], lg["workers"]["worker:1"]["buckets_s"]
    assert w1["input_wait"] > w0["input_wait"]  # the starved worker waits more
    assert abs(lg["buckets_s"]["input_wait"] - (w0["input_wait"] + w1["input_wait"]) / 2) < 1e-6
    assert "worker worker:1: goodput" in text


def test_ls_info_of_a_group(tmp_path):
    info = run_info(make_group(tmp_path))
    assert (info.id, info.state, info.exit_code, info.steps) == ("g", "crashed", 137, STEPS)
    assert info.script == "train.py (2 workers)"


def test_follow_group_marks_a_worker_without_exit_record_lost(tmp_path):
    run = make_group(tmp_path, w1_exit=None, w1_wait=0.001)
    out = io.StringIO()
    clock = FakeClock(T0 + 100)
    snap = follow_group(GroupSource(worker_dirs(run)), lambda: False, out=out, clock=clock,
                        sleep=lambda s: None, exit_grace_s=0)
    by = {w.name: w.status for w in snap.workers}
    assert by == {"worker:0": "crashed", "worker:1": "lost"}
    text = out.getvalue()
    assert "worker:0 step 80 p50 100 ms input 1.0% [crashed (exit 143)]" in text
    assert "worker:1 step 80 p50 100 ms input 1.0% [lost]" in text


def test_replay_source_keeps_tags_across_seeks(tmp_path):
    src = make_group_replay_source(worker_dirs(make_group(tmp_path)), paused=True)
    src._clock = FakeClock(0.0)
    src.seek_end()
    first = src.poll_tagged()
    assert len(first) == 2 * (STEPS + 5) and {n for n, _ in first} == {"worker:0", "worker:1"}
    assert all(m.worker == n for n, m in first if isinstance(m, Hello))
    src.seek_start()
    src.seek_end()
    again = src.poll_tagged()
    assert [(n, type(m)) for n, m in again] == [(n, type(m)) for n, m in first]


class _State:
    def __init__(self):
        self.connected, self.lost = {}, {}

    def set_connected(self, c, worker=None):
        self.connected[worker] = c

    def set_lost(self, reason, worker=None):
        self.lost[worker] = reason


def test_live_group_source_declares_a_vanished_worker_lost(tmp_path):
    run = make_group(tmp_path, w1_exit=None)
    clock = FakeClock(0.0)
    alive = {9999990: False, 9999991: False}
    src = GroupSource(worker_dirs(run), clock=clock, run_alive=lambda meta: alive.get(meta.get("child_pid"), False))
    src.poll_tagged()
    state = _State()
    apply_worker_health(src, state)
    assert state.connected == {"worker:1": False} and state.lost == {}  # worker 0 ended; 1 just vanished
    clock.t = 5.0
    apply_worker_health(src, state)
    assert "process 9999991 is gone" in state.lost["worker:1"]
    alive[9999991] = True  # a running worker is connected and never lost
    state = _State()
    apply_worker_health(src, state)
    assert state.connected == {"worker:1": True} and state.lost == {}


def _dashboard_text(run: Path, size: tuple[int, int]) -> str:
    async def go() -> str:
        src = make_group_replay_source(worker_dirs(run), paused=True)
        src._clock = FakeClock(0.0)
        src.seek_end()
        app = TpuwatchApp(src, run_dir=run, refresh_hz=0, clock=FakeClock(T0 + 20))
        async with app.run_test(size=size) as pilot:
            app.pull()
            await pilot.pause()
            app.pull()
            await pilot.pause()
            return screen_text(app)

    return asyncio.run(go())


def test_dashboard_at_80x24_shows_workers_in_place_of_memory(tmp_path):
    text = _dashboard_text(make_group(tmp_path), (80, 24))
    assert "Workers" in text and "Memory" not in text
    assert "worker:0 exit 143" in text
    assert "worker:1 exit 137  SLOW #80" in text  # the straggler, marked
    assert "r3" in text  # all four replicas' losses in one panel
    assert len(text.splitlines()) == 24


def test_dashboard_wide_shows_workers_row_with_memory(tmp_path):
    text = _dashboard_text(make_group(tmp_path), (160, 48))
    assert "Workers" in text and "Memory" in text
    row = next(line for line in text.splitlines() if "worker:1" in line and "crashed (exit 137)" in line)
    assert "straggler: input wait +59 ms" in row and "RSS 601 MiB" in row and "host1" in row


def test_single_worker_run_has_no_workers_panel(tmp_path):
    from ui_support import ended_replay

    async def go() -> str:
        app = TpuwatchApp(ended_replay("healthy_4replica"), refresh_hz=0)
        async with app.run_test(size=(80, 24)) as pilot:
            app.pull()
            await pilot.pause()
            return screen_text(app)

    text = asyncio.run(go())
    assert "Workers" not in text and "Memory" in text

"""One viewer over several hosts in summary mode, on real sockets: each host a real agent transport
(``tpuwatch.agent.transport.Server``: TCP, token, streaming from a byte offset) over its own
recording, written as training goes on (a backlog first, then a step every 20 ms). The viewer is
``RemoteSource`` feeding a ``RunState`` and the findings feed, as the dashboard does.

Checked: the hosts other than worker 0 send summaries, worker 0 is switched to its full stream;
each worker's step, its replica losses (with the step they belong to) and the straggler come out
of the summaries as recorded; a zoom gives one worker's every record from where it was; at the end
every stream's offset is its recording's size (nothing lost, nothing repeated). And an agent from
before summaries (which ignores the request) still works."""

from __future__ import annotations

import math
import secrets
import threading
import time
from pathlib import Path

import pytest

from tpuwatch import protocol
from tpuwatch.agent.transport import Server
from tpuwatch.monitor.diagnostics.feed import FindingsFeed
from tpuwatch.monitor.state import RunState
from tpuwatch.protocol import Exit, Step
from tpuwatch.sources.remote_source import RemoteSource
from tpuwatch_testing import RecordingAgent

HOSTS = 4
SLOW = 2  # the host whose input is slow
REPLICAS = 2
STEP_S = 0.02


def _loss(i: int, step: int, r: int) -> float:
    return 3.0 / (1 + step / 50) + 0.001 * (i * REPLICAS + r)


class _Pod:
    def __init__(self, base: Path, token: str) -> None:
        self.files, self.servers, self.paths = [], [], []
        self.step = 0
        self.done = threading.Event()
        t0 = time.time()
        for i in range(HOSTS):
            d = base / f"host{i}"
            d.mkdir()
            host = RecordingAgent(d)
            self.paths.append(host.events_path)
            f = open(host.events_path, "ab", buffering=0)
            f.write(b"".join(protocol.encode(m) for m in [
                protocol.Hello(protocol_version=protocol.PROTOCOL_VERSION, agent_version="test", run_id="pod", t=t0,
                               pid=100 + i, host=f"h{i}", worker=f"worker:{i}", python_version="3", tf_version="2",
                               keras_version="3", script="train.py", argv=("train.py",)),
                protocol.Topology(t=t0, strategy="TPUStrategyV2", replicas=REPLICAS * HOSTS, local_replicas=REPLICAS,
                                  num_workers=HOSTS, worker_index=i, device_kind="TPU v4",
                                  devices=tuple(f"TPU:{i}:{r}" for r in range(REPLICAS)), is_tpu=True)]))
            self.files.append(f)
            self.servers.append(Server(host, None, ("127.0.0.1", 0), token))
        self.write(60)  # a backlog: the viewer attaches late
        for s in self.servers:
            s.start()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def write(self, n: int) -> None:
        for _ in range(n):
            self.step += 1
            t = time.time()
            for i, f in enumerate(self.files):
                losses = tuple(_loss(i, self.step, r) for r in range(REPLICAS))
                msgs = [Step(step=self.step, t=t, step_time_s=STEP_S, input_wait_s=0.015 if i == SLOW else 0.001,
                             loss=sum(losses) / REPLICAS, replica_losses=losses, function="train_step")]
                if self.step % 10 == 0:
                    msgs.append(protocol.HostSample(t=t, rss_bytes=(1 << 30) * (i + 1), available_bytes=1 << 34,
                                                    total_bytes=1 << 35, cpu_percent=50.0))
                f.write(b"".join(protocol.encode(m) for m in msgs))

    def _run(self) -> None:
        while not self.done.is_set():
            self.write(1)
            time.sleep(STEP_S)

    def end(self) -> None:
        self.done.set()
        self.thread.join(10)
        for f in self.files:
            f.write(protocol.encode(Exit(t=time.time(), exit_code=0)))
            f.close()

    def close(self) -> None:
        self.done.set()
        for s in self.servers:
            s.close()


@pytest.fixture
def pod(tmp_path):
    token = secrets.token_urlsafe(24)
    p = _Pod(tmp_path, token)
    p.token = token
    yield p
    p.close()


class _Viewer:
    def __init__(self, source: RemoteSource) -> None:
        self.source = source
        self.state = RunState()
        self.feed = FindingsFeed(time.time)
        self.kinds: dict[str, list[str]] = {}

    def pump(self, until, timeout: float = 60.0, what: str = ""):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for worker, msg in self.source.poll_tagged():
                self.kinds.setdefault(worker or "", []).append(msg.kind)
                self.state.apply(msg, worker)
                self.feed.apply(msg, worker)
            self.feed.evaluate(self.state, time.time())
            snap = self.state.snapshot()
            got = until(snap)
            if got:
                return got
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}: {self.state.snapshot().workers}")


def _straggler(snap):
    return next((f for f in snap.findings if f.rule == "straggler-host"), None)


def test_summaries_give_steps_losses_and_the_straggler_and_a_zoom_gives_every_record(pod):
    source = RemoteSource([s.tcp_address for s in pod.servers], pod.token, summary=True)
    viewer = _Viewer(source)
    try:
        f = viewer.pump(_straggler, what="the straggler from summaries")
        assert f.worker == f"worker:{SLOW}" and f.evidence["metric"] == "input_wait"
        snap = viewer.pump(lambda s: s if len(s.workers) == HOSTS and all(w.step > 60 for w in s.workers) else None,
                           what="every worker live")
        by_name = {s.worker: s for s in source.streams}
        # worker 0 (the primary) was switched to every record; the others came as summaries
        assert not by_name["worker:0"].summary and by_name["worker:0"].connects == 2
        for i in range(1, HOSTS):
            name = f"worker:{i}"
            assert by_name[name].summary and by_name[name].summaries > 0
            assert "step" not in viewer.kinds[name] and "host_sample" not in viewer.kinds[name]
        assert viewer.kinds["worker:0"].count("step") >= 60
        # each worker's step is one its host recorded, recently; its losses name their step and equal
        # what that host recorded for it
        for w in snap.workers:
            assert 0 <= pod.step - w.step < 200
            assert w.step_p50_s == pytest.approx(STEP_S)
        rows = [r for r in snap.replica_losses if r.worker == f"worker:{SLOW}"]
        assert [r.index for r in rows] == [SLOW * REPLICAS + r for r in range(REPLICAS)]
        for r in rows:
            assert math.isclose(r.loss, _loss(SLOW, r.step, r.index - SLOW * REPLICAS), rel_tol=1e-12)
        rss = {h.worker: h.rss_bytes for h in snap.host_memory}
        assert rss == {f"worker:{i}": (1 << 30) * (i + 1) for i in range(HOSTS)}

        # zoom: worker 3's stream carries every record from where it was
        assert source.zoom("worker:3") and not source.zoom("worker:3")
        before = len(viewer.kinds["worker:3"])
        viewer.pump(lambda s: viewer.kinds["worker:3"][before:].count("step") >= 20, what="worker:3's records")
        assert "host_summary" not in viewer.kinds["worker:3"][before + 2:]
        assert source.full_workers() == {"worker:0", "worker:3"}

        pod.end()
        viewer.pump(lambda s: s.status == "finished", what="the end")
        # every stream accounted for its whole recording: nothing lost, nothing read twice
        for stream, path in zip(source.streams, pod.paths):
            assert stream.offset == path.stat().st_size, stream.label
        steps = [m for m in viewer.kinds["worker:3"] if m == "step"]
        assert len(steps) <= pod.step  # no record twice
        assert viewer.state.snapshot().workers[3].step == pod.step
    finally:
        source.close()


def test_an_agent_without_summaries_still_works(pod, monkeypatch):
    # an agent from before summaries ignores Attach.summary (an unknown field) and sends every line
    monkeypatch.setattr(Server, "summaries", False)
    source = RemoteSource([s.tcp_address for s in pod.servers], pod.token, summary=True)
    viewer = _Viewer(source)
    try:
        f = viewer.pump(_straggler, what="the straggler from full streams")
        assert f.worker == f"worker:{SLOW}"
        pod.end()
        viewer.pump(lambda s: s.status == "finished", what="the end")
        for stream, path in zip(source.streams, pod.paths):
            assert stream.summaries == 0 and stream.offset == path.stat().st_size
        for i in range(HOSTS):
            assert viewer.kinds[f"worker:{i}"].count("step") == pod.step
    finally:
        source.close()


def test_the_workers_panel_zooms_the_selected_worker(pod):
    """Pilot: focus the Workers panel, `]` selects the next worker, `v` gives its every record."""
    import asyncio

    from tpuwatch.ui.app import TpuwatchApp
    from tpuwatch.ui.widgets.workers_panel import WorkersPanel

    source = RemoteSource([s.tcp_address for s in pod.servers], pod.token, summary=True)

    async def run() -> None:
        app = TpuwatchApp(source, title="pod")
        async with app.run_test(size=(160, 48)) as pilot:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (
                    len(app.snapshot.workers) == HOSTS and sum(w.summary for w in app.snapshot.workers) == HOSTS - 1):
                await pilot.pause(0.1)
            panel = app.query_one(WorkersPanel)
            assert f"{HOSTS - 1} on summaries" in str(panel.border_subtitle)
            panel.focus()
            await pilot.press("right_square_bracket", "right_square_bracket")  # worker:0 -> worker:2
            assert panel.selected_worker() == "worker:2"
            await pilot.press("v")
            assert source.full_workers() == {"worker:0", "worker:2"}
            while time.monotonic() < deadline and next(
                    w for w in app.snapshot.workers if w.name == "worker:2").summary:
                await pilot.pause(0.1)
            assert not next(w for w in app.snapshot.workers if w.name == "worker:2").summary
            await pilot.press("v")  # already full: says so, changes nothing
            assert source.full_workers() == {"worker:0", "worker:2"}

    try:
        asyncio.run(run())
    finally:
        source.close()

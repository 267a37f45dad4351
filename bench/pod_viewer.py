"""One viewer attached to a simulated TPU pod: N hosts x 4 chips, each a synthetic agent on 127.0.0.1.

A *pod* subprocess plays N hosts of one synchronous job. Each host has its own recording and its
own ``tpuwatch.agent.transport.Server`` (the agent's real TCP transport: handshake, token,
streaming from a byte offset), all with one shared ``TPUWATCH_TOKEN`` (from the environment, as on
a real pod). Every host records a hello, a topology (TPUStrategy, 4 local replicas, worker i of N),
a step every 100 ms (4 replica losses, synchronised across hosts) and a host sample + 4 chip
samples at 4 Hz, flushed every 50 ms. One host (``--slow-host``) waits 60 ms for input per step
against 2 ms on the others: the straggler. The pod starts with ``--backlog`` seconds already
recorded, so the viewer attaches late and must catch up.

A *viewer* subprocess is the dashboard (``TpuwatchApp`` on ``make_remote_source``, what
``tpuwatch attach @hosts.txt`` runs; headless, 160x48, its normal 4 Hz drain and 1 Hz frames).
With ``--summaries auto`` (the default, as ``attach``) a viewer of more than 16 hosts takes one
summary a second from each (worker 0 full); ``on``/``off`` force either way.
It reports:
- catch-up: seconds from start until every host's newest step is live (recorded after the attach);
- straggler: seconds from start until the ``straggler-host`` finding appears, and whom it names;
  and when the slow host's first summary reached the viewer (what the simulated pod takes to
  deliver it), then how long the viewer took to apply, judge (the findings are evaluated once a
  second, and half a second after the last time when a worker's first steps came) and show it;
- display lag at each frame shown after catch-up: now minus the newest step time of the
  primary host, and of the *most behind* host (p50 / p95 / max);
- CPU (process_time / wall over the steady window, % of one core) and RSS (end, peak).

    .venv/bin/python bench/pod_viewer.py [--hosts 8,64,256] [--backlog 60] [--seconds 20] [--summaries auto]
        [--profile DIR]  # each stage's time and a cProfile of the viewer's reads, DIR/viewer-N.txt

Prints first the agent side's cost of the summary stream (microseconds per recorded line folded,
on the stream thread), then one line per pod size with the 1-minute load average. Targets: lag
< 1 s, CPU < 50% of a core, RSS < 300 MB, straggler named within 5 s. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tpuwatch import protocol  # noqa: E402

STEP_S = 0.1
SAMPLE_HZ = 4.0
CHIPS = 4
FLUSH_S = 0.05
HOSTS_PER_PROCESS = 128  # the simulated pod's hosts per process
GiB = 1 << 30


# --- the pod -------------------------------------------------------------------------------------


class _HostAgent:
    """What ``transport.Server`` needs from an agent: the recording, and somewhere for events."""

    def __init__(self, run_dir: Path) -> None:
        self.events_path = run_dir / "events.jsonl"
        self.events: list[str] = []

    def event(self, level: str, source: str, message: str) -> None:
        self.events.append(f"{level} {source}: {message}")

    def submit(self, command: protocol.Command) -> None:
        pass


def _head(i: int, n: int, t0: float) -> list[protocol.Message]:
    devices = tuple(f"/job:worker/replica:0/task:{i}/device:TPU:{c}" for c in range(CHIPS))
    return [
        protocol.Hello(protocol_version=protocol.PROTOCOL_VERSION, agent_version="bench", run_id="pod", t=t0,
                       pid=1000 + i, host=f"pod-host-{i}", worker=f"worker:{i}", python_version="3.11",
                       tf_version="2.21.0", keras_version="3.15.0", script="train.py", argv=("train.py",)),
        protocol.Topology(t=t0, strategy="TPUStrategyV2", replicas=CHIPS * n, local_replicas=CHIPS, num_workers=n,
                          worker_index=i, device_kind="TPU v4", devices=devices, is_tpu=True),
        protocol.Config(t=t0, mixed_precision="mixed_bfloat16", global_batch_size=32 * CHIPS * n,
                        per_replica_batch_size=32, steps_per_execution=1),
    ]


def _step(i: int, step: int, t: float, slow: bool) -> protocol.Step:
    loss = 2.0 * math.exp(-step / 3000) + 0.01 * math.sin(step + i)
    losses = tuple(loss * (1 + 0.002 * (c - 1.5)) for c in range(CHIPS))
    return protocol.Step(step=step, t=t, step_time_s=STEP_S * (1 + 0.02 * math.sin(step)),
                         input_wait_s=0.06 if slow else 0.002, loss=loss, replica_losses=losses,
                         examples=32 * CHIPS, function="train_step", epoch=0)


def _samples(i: int, t: float, k: int) -> list[protocol.Message]:
    out: list[protocol.Message] = [protocol.HostSample(t=t, rss_bytes=6 * GiB + (k % 5) * (1 << 20),
                                                       available_bytes=300 * GiB, total_bytes=400 * GiB,
                                                       cpu_percent=150.0)]
    for c in range(CHIPS):
        out.append(protocol.DeviceSample(t=t, device=f"/job:worker/replica:0/task:{i}/device:TPU:{c}",
                                         current_bytes=20 * GiB + (k % 3) * (1 << 20), peak_bytes=24 * GiB,
                                         limit_bytes=32 * GiB, source="tpu-info", limit_source="chip table v4",
                                         duty_cycle_pct=88.0))
    return out


_T_MARK = 1234567.125  # a sample time no real one equals: cached sample lines get the real one


def _sample_lines(i: int, t: float, k: int, cache: dict) -> bytes:
    """``_samples(i, t, k)`` encoded (cached per host and value pattern: the simulator's own cost
    must not crowd out what it simulates on a 2-core box)."""
    key = (i, k % 15)
    lines = cache.get(key)
    if lines is None:
        lines = cache[key] = b"".join(protocol.encode(m) for m in _samples(i, _T_MARK, k))
    return lines.replace(b'"t":%r' % _T_MARK, b'"t":%r' % t)


def serve_pod(n: int, backlog_s: float, slow_host: int, ports_file: Path, seconds: float, first: int = 0,
              count: int | None = None, t0: float | None = None, flush_s: float = FLUSH_S) -> None:
    """Hosts ``first`` .. ``first + count - 1`` of a pod of ``n`` (the pod is served by several
    processes, as it runs on many machines: one process's lock would be the bottleneck)."""
    from tpuwatch.agent.transport import Server

    token = os.environ["TPUWATCH_TOKEN"]
    base = Path(tempfile.mkdtemp(prefix="tpuwatch-pod-"))
    now = time.time()
    t0 = now - backlog_s if t0 is None else t0
    count = n - first if count is None else count
    files, servers = [], []
    cache: dict = {}
    for i in range(first, first + count):
        run_dir = base / f"host{i}"
        run_dir.mkdir()
        f = open(run_dir / "events.jsonl", "ab", buffering=0)
        files.append(f)
        servers.append(Server(_HostAgent(run_dir), None, ("127.0.0.1", 0), token))
    step, k = 0, 0  # last step and sample index written (the same on every host: synchronous)

    def write_until(t_end: float) -> None:
        nonlocal step, k
        steps = []
        while t0 + (step + 1) * STEP_S <= t_end:
            step += 1
            steps.append((step, t0 + step * STEP_S))
        samples = []
        while t0 + k / SAMPLE_HZ <= t_end:
            samples.append((k, t0 + k / SAMPLE_HZ))
            k += 1
        for i, f in enumerate(files, first):
            lines = [(t, protocol.encode(_step(i, s, t, i == slow_host))) for s, t in steps]
            lines += [(t, _sample_lines(i, t, kk, cache)) for kk, t in samples]
            lines.sort(key=lambda x: x[0])
            if lines:
                f.write(b"".join(line for _, line in lines))

    for i, f in enumerate(files, first):
        f.write(b"".join(protocol.encode(m) for m in _head(i, n, t0)))
    write_until(now)
    for s in servers:
        s.start()
    tmp = ports_file.with_suffix(".tmp")
    tmp.write_text("".join("%s:%d\n" % s.tcp_address for s in servers))
    tmp.rename(ports_file)
    stop = time.monotonic() + seconds
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while time.monotonic() < stop:
        time.sleep(flush_s)
        write_until(time.time())


# --- the viewer ----------------------------------------------------------------------------------


def fold_cost() -> tuple[float, float]:
    """Microseconds per recorded line the agent's stream thread spends folding one host's
    recording into summaries, and per line streamed as it is (the full stream's own work)."""
    from tpuwatch.agent.summary import SummaryBuilder

    t0 = time.time()
    lines: list[bytes] = []
    for step in range(1, 20_001):
        lines.append(protocol.encode(_step(0, step, t0 + step * STEP_S, False)))
        if step % 3 == 0:
            lines += [protocol.encode(m) for m in _samples(0, t0 + step * STEP_S, step)]
    b = SummaryBuilder(0, time.time)
    start = time.perf_counter()
    for i, line in enumerate(lines):
        b.feed(line)
        if i % 300 == 0:
            b.tick()
    folded = (time.perf_counter() - start) / len(lines) * 1e6
    start = time.perf_counter()
    data = b"".join(lines)
    cut = 0
    while cut < len(data):  # what the full stream does per line: find it
        cut = data.index(b"\n", cut) + 1
    plain = (time.perf_counter() - start) / len(lines) * 1e6
    return folded, plain


class _Trace:
    """Where the time to name the straggler goes, stage by stage (seconds after the attach): the
    slow host's first summary reaching the viewer (the pod's part), applied, found by the rule,
    shown (the viewer's). With ``--profile`` also a cProfile of the reader thread's reads (the
    viewer's work but drawing) and every stage, into a file."""

    def __init__(self, attach_t: float, slow: str, profile: bool) -> None:
        import cProfile

        self.attach_t, self.slow = attach_t, slow
        self.marks: dict[str, float] = {}
        self.first_summary: dict[str, float] = {}  # worker -> its first summary with steps, queued
        self.reads: list[tuple[float, float, int]] = []  # (start, seconds, messages queued after)
        self.profile = cProfile.Profile() if profile else None

    def mark(self, what: str) -> None:
        self.marks.setdefault(what, time.time() - self.attach_t)

    def hook_source(self, slow_address: tuple[str, int]) -> None:
        from tpuwatch.control.client import AgentClient
        from tpuwatch.protocol import HostSummary
        from tpuwatch.sources.remote_source import RemoteSource

        connect = AgentClient._connect
        self.connected: list[float] = []

        def traced_connect(client: AgentClient, offset: int, summary: bool = False):  # type: ignore[no-untyped-def]
            slow = client.tcp == slow_address and offset >= 0
            if slow:
                self.mark("slow host: connecting")
            sock = connect(client, offset, summary)
            if offset >= 0:
                self.connected.append(time.time() - self.attach_t)
            if slow:
                self.mark("slow host: connected, attach sent")
            return sock

        AgentClient._connect = traced_connect  # type: ignore[method-assign]

        put = RemoteSource._put

        def traced(source: RemoteSource, stream, msg) -> bool:  # type: ignore[no-untyped-def]
            if stream.worker == self.slow:
                self.mark("slow host's first message queued")
            if type(msg) is HostSummary and msg.records and stream.worker not in self.first_summary:
                self.first_summary[stream.worker] = time.time() - self.attach_t
                if stream.worker == self.slow:
                    self.mark("slow host's first summary queued")
            return put(source, stream, msg)

        RemoteSource._put = traced  # type: ignore[method-assign]

    def hook_reader(self, reader, source) -> None:  # type: ignore[no-untyped-def]
        read = reader.read

        def traced():  # type: ignore[no-untyped-def]
            start = time.time()
            if self.profile:
                self.profile.enable()
            try:
                return read()
            finally:
                if self.profile:
                    self.profile.disable()
                self.reads.append((start - self.attach_t, time.time() - start, source._queue.qsize()))
                w = reader._findings.engine.telemetry.workers.get(self.slow)
                if w is not None and w.window:
                    self.mark("slow host's summary applied")
                if any(f.rule == "straggler-host" for f in reader.state._findings.values()):
                    self.mark("straggler found (in the state)")

        reader.read = traced

    def report(self, path: Path) -> None:
        import pstats

        for what, times in (("first summaries queued", self.first_summary.values()),
                            ("streams connected", self.connected)):
            ordered = sorted(times)
            for p in (10, 50, 90, 100) if ordered else ():
                self.marks[f"{what}: {p}% of hosts"] = ordered[min(len(ordered) - 1, len(ordered) * p // 100)]
        durations = sorted(d for _, d, _ in self.reads)
        with open(path, "w") as f:
            for what, t in sorted(self.marks.items(), key=lambda x: x[1]):
                f.write(f"{t:8.2f} s  {what}\n")
            if durations:
                f.write(f"reads: {len(durations)}, seconds p50 {durations[len(durations) // 2]:.3f} "
                        f"max {durations[-1]:.3f} total {sum(durations):.2f}\n")
            for start, d, left in self.reads[:80]:
                f.write(f"  read at {start:7.2f} s: {d * 1e3:6.0f} ms, {left} messages queued after\n")
            if self.profile:
                pstats.Stats(self.profile, stream=f).sort_stats("cumulative").print_stats(60)
                pstats.Stats(self.profile, stream=f).sort_stats("tottime").print_stats(40)


async def view(addresses: list[tuple[str, int]], n: int, seconds: float, slow_host: int, deadline_s: float,
               summary: bool | None = None, profile: Path | None = None) -> dict:
    import psutil

    from tpuwatch.sources.remote_source import make_remote_source
    from tpuwatch.ui.app import TpuwatchApp

    attach_t = time.time()
    rss0 = psutil.Process().memory_info().rss
    trace = _Trace(attach_t, f"worker:{slow_host}", profile is not None)
    trace.hook_source(addresses[slow_host])
    source = make_remote_source(addresses, os.environ["TPUWATCH_TOKEN"], summary=summary)
    app = TpuwatchApp(source, title="pod bench")
    trace.hook_reader(app._reader, source)
    out: dict = {"hosts": n}
    lag_primary: list[float] = []
    lag_worst: list[float] = []
    frames = [0]
    caught_up: list[float] = []
    # every frame the dashboard shows passes here (its reader thread reads; the UI thread shows)
    original = app._show_frame
    shown = [None]

    def pull(frame) -> None:  # type: ignore[no-untyped-def]
        original(frame)
        s = app.snapshot
        now = time.time()
        if s is shown[0]:
            return
        shown[0] = s
        frames[0] += 1
        if "straggler_s" not in out:
            for f in s.findings:
                if f.rule == "straggler-host":
                    trace.mark("straggler shown")
                    out["straggler_s"] = now - attach_t
                    out["straggler_names"] = f.worker or f.message[:80]
                    out["straggler_right"] = f.worker == f"worker:{slow_host}" or f"worker:{slow_host} " in f.message
        workers = [w for w in s.workers if w.last_step_t is not None]
        if not caught_up:
            if len(workers) == n and all(w.last_step_t >= attach_t for w in workers):
                caught_up.append(now - attach_t)
            return
        lag_primary.append(now - (s.last_step_t or now))
        lag_worst.append(now - min(w.last_step_t for w in workers))

    app._show_frame = pull  # type: ignore[method-assign]
    async with app.run_test(size=(160, 48)) as pilot:
        limit = time.monotonic() + deadline_s
        while not caught_up and time.monotonic() < limit:
            await asyncio.sleep(0.1)
        if not caught_up:
            out["catch_up_s"] = None
            s = app.snapshot
            behind = [time.time() - w.last_step_t for w in s.workers if w.last_step_t is not None]
            out["behind_s"] = max(behind, default=math.nan)
            out["cpu_pct"] = 100 * time.process_time() / max(1e-9, time.time() - attach_t)
            out["rss_mib"] = psutil.Process().memory_info().rss / 2**20
            out["workers_shown"] = len(s.workers)
            if profile:
                trace.report(profile)
            return out
        out["catch_up_s"] = caught_up[0]
        frames0 = frames[0]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        cpu1, wall1 = time.process_time(), time.perf_counter()
        out["frames_per_s"] = (frames[0] - frames0) / (wall1 - wall0)
        straggler_limit = time.monotonic() + 30
        while "straggler_s" not in out and time.monotonic() < straggler_limit:
            await asyncio.sleep(0.2)
        out["workers_shown"] = len(app.snapshot.workers)
        out["replicas_shown"] = len(app.snapshot.replica_losses)
        out["summarised"] = sum(1 for st in source.streams if st.summaries and st.summary)
        await pilot.pause()
    source.close()
    if profile:
        trace.report(profile)
    out["straggler_stages"] = {k: trace.marks.get(k) for k in (
        "slow host's first summary queued", "slow host's summary applied", "straggler found (in the state)")}
    out["cpu_pct"] = 100 * (cpu1 - cpu0) / (wall1 - wall0)
    out["rss_mib"] = psutil.Process().memory_info().rss / 2**20
    out["rss_start_mib"] = rss0 / 2**20
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def q(xs: list[float], p: int) -> float:
        return statistics.quantiles(xs, n=100, method="inclusive")[p - 1] if len(xs) >= 2 else (xs[0] if xs else math.nan)

    out["lag_primary"] = [q(lag_primary, 50), q(lag_primary, 95), max(lag_primary, default=math.nan)]
    out["lag_worst_host"] = [q(lag_worst, 50), q(lag_worst, 95), max(lag_worst, default=math.nan)]
    return out


# --- the driver ----------------------------------------------------------------------------------


def run_size(n: int, a: argparse.Namespace) -> dict:
    import psutil

    tmp = Path(tempfile.mkdtemp(prefix="tpuwatch-podbench-"))
    ports = tmp / "hosts.txt"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPUWATCH_TOKEN=secrets.token_urlsafe(24))
    slow = n // 3
    t0 = time.time() - a.backlog
    pods, parts = [], []
    for first in range(0, n, HOSTS_PER_PROCESS):
        part = tmp / f"hosts-{first}.txt"
        parts.append(part)
        pods.append(subprocess.Popen([sys.executable, __file__, "--serve", str(n), "--first", str(first),
                                      "--count", str(min(HOSTS_PER_PROCESS, n - first)), "--t0", repr(t0),
                                      "--backlog", str(a.backlog), "--slow-host", str(slow), "--ports", str(part),
                                      "--pod-seconds", str(a.backlog + a.seconds + 600), "--flush", str(a.flush),
                                      *(["--nice-pod"] if a.nice_pod else [])],
                                     env=env))
    try:
        limit = time.monotonic() + 300
        while not all(p.exists() for p in parts):
            if any(pod.poll() is not None for pod in pods) or time.monotonic() > limit:
                raise SystemExit(f"the simulated pod of {n} hosts did not start")
            time.sleep(0.1)
        ports.write_text("".join(p.read_text() for p in parts))
        pod_ps = [psutil.Process(pod.pid) for pod in pods]
        pod_cpu0 = sum(sum(ps.cpu_times()[:2]) for ps in pod_ps)
        load0 = os.getloadavg()[0]
        t = time.perf_counter()
        viewer = subprocess.run([sys.executable, __file__, "--view", str(ports), "--n", str(n), "--slow-host",
                                 str(slow), "--seconds", str(a.seconds), "--deadline", str(a.deadline),
                                 "--summaries", a.summaries,
                                 *(["--profile", str(a.profile / f"viewer-{n}.txt")] if a.profile else [])],
                                env=env, capture_output=True, text=True,
                                timeout=a.seconds + 900)
        wall = time.perf_counter() - t
        pod_cpu = sum(sum(ps.cpu_times()[:2]) for ps in pod_ps) - pod_cpu0
        if viewer.returncode != 0:
            raise SystemExit(f"viewer failed:\n{viewer.stderr[-3000:]}")
        result = json.loads(viewer.stdout.strip().splitlines()[-1])
        result["load"] = (load0, os.getloadavg()[0])
        result["pod_cpu_pct"] = 100 * pod_cpu / wall
        return result
    finally:
        for pod in pods:
            pod.terminate()
        for pod in pods:
            pod.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="8,64,256", help="pod sizes to measure")
    ap.add_argument("--backlog", type=float, default=60.0, help="seconds already recorded when the viewer attaches")
    ap.add_argument("--seconds", type=float, default=20.0, help="steady-state window after catching up")
    ap.add_argument("--deadline", type=float, default=600.0, help="seconds the viewer gets to catch up")
    ap.add_argument("--summaries", choices=("auto", "on", "off"), default="auto",
                    help="as `attach --summaries` (auto: summaries above 16 hosts)")
    ap.add_argument("--flush", type=float, default=FLUSH_S,
                    help="seconds between two writes of each simulated host's recording (default 0.05; a larger "
                         "value lightens the simulator where it shares a small box with the viewer)")
    ap.add_argument("--nice-pod", action="store_true",
                    help="run the simulated pod at the lowest CPU priority: it stands in for other machines, so "
                         "on a small box the viewer gets the CPU it would have beside a real pod")
    ap.add_argument("--profile", type=Path,
                    help="write, per pod size, where the time to name the straggler went (stage by stage) and a "
                         "cProfile of the viewer's reads to PROFILE/viewer-N.txt")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--view", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--slow-host", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--ports", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--t0", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--pod-seconds", type=float, default=600.0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        if a.nice_pod:
            os.nice(19)
        serve_pod(a.serve, a.backlog, a.slow_host, a.ports, a.pod_seconds, a.first, a.count, a.t0, a.flush)
        return
    if a.view:
        from tpuwatch.control.client import read_addresses

        addresses = read_addresses(["@" + str(a.view)])
        summary = {"auto": None, "on": True, "off": False}[a.summaries]
        print(json.dumps(asyncio.run(view(addresses, a.n, a.seconds, a.slow_host, deadline_s=a.deadline,
                                          summary=summary, profile=a.profile))))
        return
    print(f"{os.cpu_count()} cores; a step every {STEP_S * 1e3:.0f} ms per host, {CHIPS} chips, samples at "
          f"{SAMPLE_HZ:g} Hz, written every {a.flush:g} s; backlog {a.backlog:g} s; steady window {a.seconds:g} s; "
          f"summaries {a.summaries}{'; pod at nice 19' if a.nice_pod else ''}",
          flush=True)
    folded, plain = fold_cost()
    print(f"agent side, per recorded line on the stream thread: {folded:.1f} us folding into summaries, "
          f"{plain:.2f} us streaming as is; load {os.getloadavg()[0]:.2f}", flush=True)
    if a.profile:
        a.profile.mkdir(parents=True, exist_ok=True)
    for n in (int(x) for x in a.hosts.split(",")):
        r = run_size(n, a)

        def ms(xs: list[float]) -> str:
            return "/".join(f"{1e3 * x:.0f}" for x in xs)

        if r.get("catch_up_s") is None:
            print(f"{n:4d} hosts: did not catch up within {a.deadline:g} s: the most-behind host was "
                  f"{r['behind_s']:.0f} s behind; {r['workers_shown']} workers seen; CPU {r['cpu_pct']:.1f}% of a core "
                  f"since the start; RSS {r['rss_mib']:.0f} MiB; straggler "
                  f"{'found at %.1f s' % r['straggler_s'] if 'straggler_s' in r else 'not found'}; "
                  f"load {r['load'][0]:.2f}->{r['load'][1]:.2f}", flush=True)
            continue
        straggler = ("found at %.1f s, names %s (%s)" % (r["straggler_s"], r["straggler_names"],
                                                        "right" if r["straggler_right"] else "WRONG")
                     if "straggler_s" in r else "NOT found")
        came, applied, found = r["straggler_stages"].values()
        if "straggler_s" in r and None not in (came, applied, found):
            straggler += (f" (its host's first summary reached the viewer at {came:.1f} s: the pod's part; "
                          f"then applied +{applied - came:.2f} s, judged +{found - applied:.2f} s, "
                          f"shown +{r['straggler_s'] - found:.2f} s)")
        print(f"{n:4d} hosts: catch-up {r['catch_up_s']:.1f} s; lag p50/p95/max {ms(r['lag_primary'])} ms "
              f"(most-behind host {ms(r['lag_worst_host'])} ms); CPU {r['cpu_pct']:.1f}% of a core; RSS "
              f"{r['rss_mib']:.0f} MiB (peak {r['peak_rss_mib']:.0f}); {r['frames_per_s']:.2f} frames/s; "
              f"straggler {straggler}; "
              f"{r['workers_shown']} workers ({r['summarised']} on summaries), {r['replicas_shown']} replica "
              f"losses shown; pod simulator CPU "
              f"{r['pod_cpu_pct']:.0f}%; load {r['load'][0]:.2f}->{r['load'][1]:.2f}", flush=True)


if __name__ == "__main__":
    main()

"""``--metrics HOST:PORT``: the run's numbers on ``/metrics`` for Prometheus (docs/prometheus.md).

Served from the viewer's process with ``prometheus_client`` (never from inside training). The
values come from the relay's run state, the same numbers the dashboard and ``tpuwatch report``
show; each scrape reads the latest view, so a scrape never waits on the run.

Names follow Prometheus' conventions: ``tpuwatch_`` prefix, base units in the name
(``_seconds``, ``_bytes``, ``_ratio``), ``_total`` on counters; one series per worker (label
``worker``), per replica (``replica``), per device (``device``).
"""

from __future__ import annotations

import math
import socket
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from typing import Any, Iterator, Sequence
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from tpuwatch import address
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.protocol import Finding, Message, Step

#: Upper bounds of the step-time histogram's buckets (seconds): 1 ms to a minute.
STEP_TIME_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Every status a run can have (``tpuwatch_run_status`` has one series each, 1 for the current).
STATUSES = ("waiting", "starting", "running", "stalled", "finished", "stopped", "crashed", "lost")
#: Connections served at once; one more closes the oldest (docs/prometheus.md).
MAX_CONNECTIONS = 32
#: Seconds a connection may take to send its request or to take one block of the answer.
CONNECTION_TIMEOUT_S = 10.0


@dataclass
class _StepTimes:
    """One worker's step-time histogram, every training step counted (a record of k steps
    counts k steps of its per-step time)."""

    buckets: list[float] = field(default_factory=lambda: [0.0] * len(STEP_TIME_BUCKETS_S))
    count: float = 0.0
    sum_s: float = 0.0

    def observe(self, step_time_s: float, steps: int) -> None:
        if not math.isfinite(step_time_s) or steps <= 0:
            return
        for i, bound in enumerate(STEP_TIME_BUCKETS_S):
            if step_time_s <= bound:
                self.buckets[i] += steps
        self.count += steps
        self.sum_s += step_time_s * steps


class RunMetrics:
    """The ``--metrics`` outlet of a :class:`~tpuwatch.console.relay.Relay`, and the
    ``prometheus_client`` collector that serves what it holds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snap: RunSnapshot | None = None
        self._step_times: dict[str, _StepTimes] = {}

    # --- Outlet (the relay's thread) -------------------------------------------------------------

    def take(self, worker: str, msg: Message) -> None:
        if isinstance(msg, Step):
            with self._lock:
                self._step_times.setdefault(worker, _StepTimes()).observe(msg.step_time_s, msg.steps)

    def update(self, snap: RunSnapshot, new_findings: Sequence[Finding]) -> None:
        with self._lock:
            self._snap = snap

    def close(self, snap: RunSnapshot, new_findings: Sequence[Finding]) -> None:
        self.update(snap, new_findings)

    # --- Collector (the HTTP server's threads) ---------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            snap = self._snap
            times = {w: (list(h.buckets), h.count, h.sum_s) for w, h in self._step_times.items()}
        if snap is None:
            return
        yield from _metrics(snap, times)


def _metrics(snap: RunSnapshot, times: dict[str, tuple[list[float], float, float]]) -> Iterator[Metric]:
    info = GaugeMetricFamily("tpuwatch_run_info", "The run tpuwatch watches (always 1)",
                             labels=["run_id", "script", "strategy", "device_kind", "tf_version"])
    info.add_metric([snap.run_id, snap.script, snap.strategy, snap.device_kind, snap.tf_version], 1)
    yield info
    status = GaugeMetricFamily("tpuwatch_run_status", "1 for the run's current status, 0 for the others "
                               "(running, stalled, finished, crashed, ...)", labels=["status"])
    for s in STATUSES:
        status.add_metric([s], 1.0 if snap.status == s else 0.0)
    yield status
    if snap.epoch is not None:
        yield GaugeMetricFamily("tpuwatch_epoch", "The epoch training is in (0-based, as Keras counts)",
                                value=snap.epoch)
    if snap.total_steps:
        yield GaugeMetricFamily("tpuwatch_planned_steps", "Training steps the script plans", value=snap.total_steps)

    workers = snap.workers
    steps = CounterMetricFamily("tpuwatch_steps", "Training steps done (the script's global step count)",
                                labels=["worker"])
    wait = GaugeMetricFamily("tpuwatch_input_wait_ratio", "Share of recent step time spent waiting for input",
                             labels=["worker"])
    rss = GaugeMetricFamily("tpuwatch_host_rss_bytes", "Resident memory of the training process", labels=["worker"])
    for w in workers:
        steps.add_metric([w.name], w.step)
        if w.input_wait_frac is not None:
            wait.add_metric([w.name], w.input_wait_frac)
        if w.rss_bytes is not None:
            rss.add_metric([w.name], w.rss_bytes)
    yield steps
    yield wait
    yield rss
    avail = GaugeMetricFamily("tpuwatch_host_available_bytes", "Memory available on the training host",
                              labels=["worker"])
    for h in snap.host_memory:
        avail.add_metric([h.worker], h.available_bytes)
    yield avail

    hist = HistogramMetricFamily("tpuwatch_step_time_seconds", "Time of one training step", labels=["worker"])
    for worker, (buckets, count, sum_s) in sorted(times.items()):
        pairs = [(repr(b), c) for b, c in zip(STEP_TIME_BUCKETS_S, buckets)] + [("+Inf", count)]
        hist.add_metric([worker], pairs, sum_s)
    yield hist

    loss = GaugeMetricFamily("tpuwatch_replica_loss", "Each replica's latest loss (NaN when it is not finite)",
                             labels=["worker", "replica"])
    for r in snap.replica_losses:
        loss.add_metric([r.worker, str(r.index)], r.loss)
    yield loss
    if snap.loss is not None:
        yield GaugeMetricFamily("tpuwatch_loss", "The loss, the mean over replicas", value=snap.loss)

    used = GaugeMetricFamily("tpuwatch_device_memory_bytes", "Device memory in use", labels=["worker", "device"])
    peak = GaugeMetricFamily("tpuwatch_device_memory_peak_bytes", "Device memory peak", labels=["worker", "device"])
    limit = GaugeMetricFamily("tpuwatch_device_memory_limit_bytes", "Device memory the device has",
                              labels=["worker", "device"])
    for d in snap.device_memory:
        used.add_metric([d.worker, d.device], d.current_bytes)
        peak.add_metric([d.worker, d.device], d.peak_bytes)
        if d.limit_bytes:
            limit.add_metric([d.worker, d.device], d.limit_bytes)
    yield used
    yield peak
    yield limit

    counts: dict[tuple[str, str], int] = {}
    for f in snap.findings:
        counts[(f.rule, f.severity)] = counts.get((f.rule, f.severity), 0) + 1
    findings = GaugeMetricFamily("tpuwatch_findings", "Diagnostics findings standing now, by rule and severity",
                                 labels=["rule", "severity"])
    for (rule, severity), n in sorted(counts.items()):
        findings.add_metric([rule, severity], n)
    yield findings


class _Handler(WSGIRequestHandler):
    """One request per connection, each socket operation bounded by CONNECTION_TIMEOUT_S (a
    client that connects and waits is dropped), nothing logged."""

    timeout = CONNECTION_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _BoundedServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most MAX_CONNECTIONS of them: a new connection beyond that
    shuts the oldest one down (its thread wakes and ends), so clients that connect and wait can
    neither use up the viewer's file descriptors nor keep a scrape out for longer than the
    scrape's own few milliseconds. An accept that fails (EMFILE) is skipped by socketserver."""

    daemon_threads = True
    request_queue_size = 64
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily) -> None:
        self.address_family = family
        self._open: OrderedDict[socket.socket, None] = OrderedDict()
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            while len(self._open) >= MAX_CONNECTIONS:
                oldest, _ = self._open.popitem(last=False)
                try:
                    oldest.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._open[request] = None
        try:
            super().process_request(request, client_address)
        except RuntimeError:  # no thread could be started: drop this one connection
            self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):  # a timeout, a reset, a connection closed above
            return
        super().handle_error(request, client_address)

    def close_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.pop(request, None)
        super().close_request(request)


class MetricsServer:
    """``/metrics`` on ``HOST:PORT`` (bound by :meth:`open`, before the script starts)."""

    def __init__(self, host: str, httpd: WSGIServer, thread: threading.Thread, metrics: RunMetrics) -> None:
        self.host = host
        self.httpd = httpd
        self.thread = thread
        self.metrics = metrics

    @property
    def loopback(self) -> bool:
        """Whether only this machine can connect (127.0.0.0/8, ::1, localhost)."""
        import ipaddress

        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:  # a host name: whatever it resolves to, it may be reachable
            return False

    @property
    def url(self) -> str:
        port = self.httpd.server_address[1]
        return f"http://{'[' + self.host + ']' if ':' in self.host else self.host}:{port}/metrics"

    @classmethod
    def open(cls, value: str) -> "MetricsServer":
        """Binds ``value`` (HOST:PORT; HOST defaults to 127.0.0.1, port 0 picks a free one).
        Raises ValueError with one line naming what is wrong."""
        from prometheus_client.exposition import make_wsgi_app

        host, port = address.parse(value, listen=True, option="--metrics")
        metrics = RunMetrics()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(metrics)  # type: ignore[arg-type]  # a collector by its collect()
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                           flags=socket.AI_PASSIVE)[0]
            httpd = _BoundedServer((str(sockaddr[0]), port), family)
        except OSError as e:
            raise ValueError(f"--metrics {value!r}: cannot listen there ({e.strerror or e}); give a free port of "
                             f"this machine, e.g. {address.EXAMPLE.rsplit(':', 1)[0]}:9464") from None
        httpd.set_app(make_wsgi_app(registry))
        thread = threading.Thread(target=httpd.serve_forever, name="tpuwatch-metrics", daemon=True)
        thread.start()
        return cls(host, httpd, thread, metrics)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)

"""TPU runtime metrics from libtpu (HBM used/total, duty cycle), read on the agent thread.

Why the agent side: libtpu serves its ``RuntimeMetricService`` (gRPC) on the training host's
``localhost:8431`` (or the ports in ``TPU_RUNTIME_METRICS_PORTS``), and local-channel
credentials only accept loopback peers. A viewer on a laptop (SSH, ``attach HOST:PORT``) cannot
reach it; the agent can, and what it reads travels in ``events.jsonl`` to every viewer,
``replay`` and ``report``.

What comes from the ``tpu-info`` package (the optional extra ``tpuwatch[tpu]``): chip discovery
(``tpu_info.device.get_local_chips``: PCI sysfs, vendor 0x1ae0; no TPU runtime call), the
generated gRPC stub and request messages, and the metric names (``tpu_info.metrics.MetricName``).
What does not: ``tpu_info.metrics.get_chip_usage`` itself. It opens a new channel on every call,
never closes it, and sets no deadline: a metrics port that accepts connections but never
answers would hang the agent thread, and with it the recording. Here one channel is kept per
port and every call has a short deadline; an unreachable service is retried with backoff.

When metrics are absent the sampler says why once, as an :class:`~tpuwatch.protocol.Event` with
source ``"tpu-metrics"``, fact ``EventFact.TPU_METRICS_UNAVAILABLE`` and the reason; when the reason
changes or metrics arrive (``EventFact.TPU_METRICS_AVAILABLE``) it says so again (the monitor shows
the latest reason as the memory panel's note). TF's own ``get_memory_info`` samples (the memory
probe, with the chip-table limit) remain the fallback.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from tpuwatch.agent import clocks
from tpuwatch.protocol import TPU_METRICS_SOURCE, DeviceSample, Event, EventFact, Level, Message

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.patches import Patches

PROBE = "tpu_metrics"
#: ``Event.source`` of every message about TPU metrics availability.
SOURCE = TPU_METRICS_SOURCE
DEFAULT_PORT = 8431
PORTS_ENV = "TPU_RUNTIME_METRICS_PORTS"

NO_CHIPS = "no TPU chips found"
NOT_INSTALLED = "tpu-info not installed (pip install 'tpuwatch[tpu]')"


@dataclass(frozen=True)
class ChipUsage:
    """One libtpu device (a chip from v4 on, a TensorCore on v2/v3/7x)."""

    device_id: int
    used_bytes: int
    total_bytes: int
    duty_cycle_pct: float | None  # of the chip the device belongs to


@dataclass(frozen=True)
class Reading:
    """What one look at the TPU metrics found: usage, or the one-line reason there is none."""

    chip: str  # "TPU v4 chip", "" when none was found
    chips: int
    port: int | None  # the port that answered
    usage: tuple[ChipUsage, ...] = ()
    reason: str = ""  # why there is no usage ("" when there is)

    @property
    def ok(self) -> bool:
        return not self.reason


class MetricsUnreachable(Exception):
    """No listed port answered (refused, or no answer within the deadline)."""


def metrics_ports(environ: Mapping[str, str] | None = None) -> tuple[int, ...]:
    """Ports of libtpu's metrics service: ``TPU_RUNTIME_METRICS_PORTS`` ("8431,8432"), else 8431.

    Raises ValueError with a one-line message when the variable is set but not a port list.
    """
    raw = (environ if environ is not None else os.environ).get(PORTS_ENV, "").strip()
    if not raw:
        return (DEFAULT_PORT,)
    ports = []
    for part in raw.split(","):
        part = part.strip()
        if not part.isdigit() or not 0 < int(part) < 65536:
            raise ValueError(f"{PORTS_ENV}={raw!r}: expected comma-separated port numbers")
        ports.append(int(part))
    return tuple(ports)


def describe_ports(ports: tuple[int, ...]) -> str:
    return f"port {ports[0]}" if len(ports) == 1 else "ports " + ", ".join(map(str, ports))


def find_chips() -> tuple[Any, int, str]:
    """(tpu-info ``TpuChip`` or None, chip count, reason when none). Reads sysfs only."""
    try:
        from tpu_info import device
    except ImportError:
        return None, 0, NOT_INSTALLED
    try:
        chip, count = device.get_local_chips()
    except OSError as e:
        return None, 0, f"cannot read PCI devices in sysfs: {e}"
    except AssertionError as e:  # tpu-info asserts a single chip type per host
        return None, 0, f"mixed TPU chip types: {e}"
    if chip is None or not count:
        return None, 0, NO_CHIPS
    return chip, int(count), ""


class MetricsClient:
    """Reads usage from libtpu's RuntimeMetricService on one port, one channel kept open."""

    def __init__(self, chip: Any, port: int, host: str = "localhost") -> None:
        import grpc
        from tpu_info import metrics
        from tpu_info.proto import tpu_metric_service_pb2 as pb
        from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc

        self._grpc = grpc
        self._pb = pb
        self._names = metrics.MetricName
        self.chip = chip
        self.port = port
        # libtpu serves with local credentials (tpu-info connects the same way).
        self._channel = grpc.secure_channel(f"{host}:{port}", grpc.local_channel_credentials())
        self._stub = pb_grpc.RuntimeMetricServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def _metric(self, name: Any, deadline: float) -> list[Any]:
        timeout = max(0.01, deadline - clocks.monotonic())
        resp = self._stub.GetRuntimeMetric(self._pb.MetricRequest(metric_name=name.value), timeout=timeout)
        return sorted(resp.metric.metrics, key=lambda m: m.attribute.value.int_attr)

    def read(self, timeout_s: float) -> tuple[ChipUsage, ...]:
        """Usage per libtpu device. Raises ``grpc.RpcError`` (the service) or ValueError (its answer).

        ``timeout_s`` bounds the three calls together.
        """
        deadline = clocks.monotonic() + timeout_s
        totals = self._metric(self._names.TOTAL_MEMORY, deadline)
        usages = self._metric(self._names.MEMORY_USAGE, deadline)
        duty = self._metric(self._names.DUTY_CYCLE_PCT, deadline)
        # As tpu-info reads them: memory is per device, duty cycle per chip, except on 7x where
        # libtpu reports duty cycle per device too (tpu_info.metrics.get_chip_usage_new).
        per_chip = self.chip.value.devices_per_chip if self.chip.value.name != "7x" else 1
        duty_per_device = [d for d in duty for _ in range(per_chip)]
        if len(totals) != len(usages):
            raise ValueError(f"libtpu reported HBM totals for {len(totals)} devices but usage for {len(usages)}")
        out = []
        for i, (u, t) in enumerate(zip(usages, totals)):
            d = duty_per_device[i].gauge.as_double if i < len(duty_per_device) else None
            out.append(ChipUsage(device_id=int(u.attribute.value.int_attr), used_bytes=int(u.gauge.as_int),
                                 total_bytes=int(t.gauge.as_int), duty_cycle_pct=None if d is None else float(d)))
        return tuple(out)


class PortReader:
    """Tries the metrics ports in order, sticking to the first that answers."""

    def __init__(self, chip: Any, ports: tuple[int, ...], timeout_s: float, host: str = "localhost") -> None:
        self.chip = chip
        self.ports = ports
        self.timeout_s = timeout_s
        self.host = host
        self._clients: dict[int, MetricsClient] = {}
        self.port: int | None = None  # the port that answered last

    def read(self) -> tuple[int, tuple[ChipUsage, ...]]:
        """(port, usage). Raises MetricsUnreachable, or RpcError/ValueError for a bad answer."""
        import grpc

        order = ([self.port] if self.port is not None else []) + [p for p in self.ports if p != self.port]
        for port in order:
            client = self._clients.get(port)
            if client is None:
                client = self._clients[port] = MetricsClient(self.chip, port, self.host)
            try:
                usage = client.read(self.timeout_s)
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    # A fresh channel next time: gRPC's own reconnect backoff (up to 2 min)
                    # would keep failing fast long after the service came up.
                    self._clients.pop(port).close()
                    continue
                raise
            self.port = port
            return port, usage
        self.port = None
        raise MetricsUnreachable(f"TPU metrics service unreachable on {describe_ports(self.ports)}")

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()


def _rpc_reason(e: Any, ports: tuple[int, ...]) -> str:
    """One line for an answer that is an error (UNIMPLEMENTED, NOT_FOUND, ...)."""
    code = getattr(e.code(), "name", str(e.code()))
    details = ((e.details() or "").splitlines() or [""])[0][:160]
    return f"TPU metrics service on {describe_ports(ports)} answered {code}" + (f": {details}" if details else "")


def read_once(ports: tuple[int, ...] | None = None, timeout_s: float = 0.5, host: str = "localhost") -> Reading:
    """One look: chips, then one reading from the first port that answers (``tpuwatch doctor``)."""
    chip, count, reason = find_chips()
    if chip is None:
        return Reading(chip="", chips=0, port=None, reason=reason)
    try:
        ports = ports or metrics_ports()
    except ValueError as e:
        return Reading(chip=str(chip), chips=count, port=None, reason=str(e))
    import grpc  # present once tpu-info is

    reader = PortReader(chip, ports, timeout_s, host)
    try:
        port, usage = reader.read()
    except MetricsUnreachable as e:
        return Reading(chip=str(chip), chips=count, port=None, reason=str(e))
    except ValueError as e:
        return Reading(chip=str(chip), chips=count, port=None,
                       reason=f"unexpected answer from the TPU metrics service: {e}")
    except grpc.RpcError as e:
        return Reading(chip=str(chip), chips=count, port=None, reason=_rpc_reason(e, ports))
    finally:
        reader.close()
    return Reading(chip=str(chip), chips=count, port=port, usage=usage)


class TpuMetricsSampler:
    """Agent sampler: DeviceSamples (source "tpu-info") per libtpu device, or a reason Event.

    Costs on the agent thread: one sysfs scan at the first call; then at most every
    ``interval_s`` three gRPC calls (~1-2 ms on localhost) bounded by ``timeout_s`` together.
    An unreachable service is retried after ``backoff_s``, doubling up to ``max_backoff_s``:
    libtpu starts serving only once the script has initialised the TPU system.
    """

    def __init__(
        self,
        agent: "Agent",
        *,
        ports: tuple[int, ...] | None = None,
        interval_s: float = 1.0,
        timeout_s: float = 0.3,
        backoff_s: float = 2.0,
        max_backoff_s: float = 30.0,
        host: str = "localhost",
        clock: Callable[[], float] = clocks.monotonic,
    ) -> None:
        self.agent = agent
        self.ports = ports
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.host = host
        self.clock = clock
        self.reason: str | None = None  # the last reason said ("" once metrics flowed)
        self.done = False  # nothing more to try (no chips, tpu-info missing)
        self._reader: PortReader | None = None
        self._chip: Any = None
        self._chips = 0
        self._next_t = 0.0
        self._backoff = backoff_s
        self._peaks: dict[int, int] = {}
        #: TF device names ("TPU:0") read from libtpu at the last reading; empty while absent.
        self.covered: frozenset[str] = frozenset()

    def __call__(self) -> list[Message]:
        if self.done:
            return []
        now = self.clock()
        if now < self._next_t:
            return []
        if self._reader is None:
            out = self._start()
            if self._reader is None:
                return out
        import grpc  # present once tpu-info is

        try:
            port, usage = self._reader.read()
        except MetricsUnreachable as e:
            return self._retry_later(now, str(e))
        except ValueError as e:
            return self._retry_later(now, f"unexpected answer from the TPU metrics service: {e}")
        except grpc.RpcError as e:
            return self._retry_later(now, _rpc_reason(e, self._reader.ports))
        self._next_t = now + self.interval_s
        self._backoff = self.backoff_s
        self.covered = frozenset(f"TPU:{u.device_id}" for u in usage)
        out = []
        if self.reason != "":
            self.reason = ""
            out.append(Event(t=self.agent.clock(), level="info", source=SOURCE,
                             message=f"TPU metrics from libtpu on port {port}: {self._chips} x {self._chip}",
                             fact=EventFact.TPU_METRICS_AVAILABLE))
        t = self.agent.clock()
        for u in usage:
            peak = max(self._peaks.get(u.device_id, 0), u.used_bytes)
            self._peaks[u.device_id] = peak
            out.append(DeviceSample(t=t, device=f"TPU:{u.device_id}", current_bytes=u.used_bytes, peak_bytes=peak,
                                    limit_bytes=u.total_bytes or None, source="tpu-info", limit_source="libtpu",
                                    duty_cycle_pct=u.duty_cycle_pct))
        return out

    def _start(self) -> list[Message]:
        chip, count, reason = find_chips()
        if chip is None:
            self.done = True
            return self._say(reason, "info" if reason == NO_CHIPS else "warning")
        try:
            ports = self.ports or metrics_ports()
        except ValueError as e:
            self.done = True
            return self._say(str(e), "warning")
        self._chip, self._chips = chip, count
        self._reader = PortReader(chip, ports, self.timeout_s, self.host)
        return []

    def _retry_later(self, now: float, reason: str) -> list[Message]:
        self.covered = frozenset()  # TF's get_memory_info samples stand in again
        self._next_t = now + self._backoff
        self._backoff = min(self._backoff * 2, self.max_backoff_s)
        return self._say(reason, "warning")

    def _say(self, reason: str, level: Level) -> list[Message]:
        if reason == self.reason:
            return []
        self.reason = reason
        return [Event(t=self.agent.clock(), level=level, source=SOURCE, message=f"TPU metrics unavailable: {reason}",
                      fact=EventFact.TPU_METRICS_UNAVAILABLE, reason=reason)]

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()


_installed: "weakref.WeakKeyDictionary[Any, TpuMetricsSampler]" = weakref.WeakKeyDictionary()


def covered_devices(agent: "Agent") -> frozenset[str]:
    """Devices whose memory libtpu reports right now (the memory probe can skip TF's figures
    for them, so one device is not shown twice with two sources)."""
    sampler = _installed.get(agent)
    return sampler.covered if sampler is not None else frozenset()


def install(agent: "Agent", patches: "Patches") -> TpuMetricsSampler:
    """Registers the sampler. Patches nothing (``patches`` for a uniform signature)."""
    sampler = TpuMetricsSampler(agent)
    agent.add_sampler(PROBE, sampler)
    _installed[agent] = sampler
    return sampler

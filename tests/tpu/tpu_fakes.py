"""A local libtpu metrics service and a fake PCI sysfs tree, for machines without a TPU.

The service is a real gRPC server on 127.0.0.1 built from the generated modules tpu-info ships
(``tpu_info.proto.tpu_metric_service_pb2[_grpc]``), served with local credentials as libtpu
does. The sysfs tree has the files tpu-info's discovery reads (``vendor``, ``device``,
``subsystem_device``, ``iommu_group``); tpu-info globs the fixed path ``/sys/bus/pci/devices/*``,
so :func:`point_tpu_info_at` swaps the ``glob`` module tpu-info's ``device`` module uses for
one that maps that path into the tree.
"""

from __future__ import annotations

import glob as _glob
import threading
import time
import types
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from tpu_info import device as tpu_device
from tpu_info.metrics import MetricName
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc

GiB = 1 << 30
SYSFS_PCI = "/sys/bus/pci/devices"

# PCI device ids from tpu_info.device.TpuChip.from_pci_device_id.
CHIP_PCI_IDS = {"v2": ("0x0027", "0x004e"), "v3": ("0x0027", "0x004f"), "v4": ("0x005e", "0x0000"),
                "v5e": ("0x0063", "0x0000"), "v5p": ("0x0062", "0x0000"), "v6e": ("0x006f", "0x0000")}


def make_sysfs(root: Path, chip: str = "v4", count: int = 4, others: int = 2) -> Path:
    """A PCI devices directory with ``count`` Google TPU functions and ``others`` non-TPU ones."""
    devices = root / "devices"
    (root / "iommu_groups").mkdir(parents=True)
    devices.mkdir(parents=True)
    device_id, subsystem = CHIP_PCI_IDS[chip]

    def add(addr: str, vendor: str, dev: str, sub: str, group: int) -> None:
        d = devices / addr
        d.mkdir()
        (d / "vendor").write_text(vendor + "\n")
        (d / "device").write_text(dev + "\n")
        (d / "subsystem_device").write_text(sub + "\n")
        g = root / "iommu_groups" / str(group)
        g.mkdir()
        (d / "iommu_group").symlink_to(g)

    for i in range(count):
        add(f"0000:00:{4 + i:02x}.0", "0x1ae0", device_id, subsystem, i)
    for i in range(others):  # a NIC and a disk controller: must be ignored
        add(f"0000:01:{i:02x}.0", "0x8086", "0x1234", "0x0000", 100 + i)
    return devices


def point_tpu_info_at(monkeypatch: pytest.MonkeyPatch, devices: Path) -> None:
    """Makes tpu-info's chip discovery (this process) read ``devices`` instead of sysfs."""

    def fake_glob(pattern: str, *args, **kwargs):
        if pattern.startswith(SYSFS_PCI):
            pattern = str(devices) + pattern[len(SYSFS_PCI):]
        return _glob.glob(pattern, *args, **kwargs)

    monkeypatch.setattr(tpu_device, "glob", types.SimpleNamespace(glob=fake_glob))


@dataclass
class Served:
    """What the fake service answers; change it while serving."""

    used: list[int] = field(default_factory=lambda: [3 * GiB, 5 * GiB, 7 * GiB, 30 * GiB])
    total: list[int] = field(default_factory=lambda: [32 * GiB] * 4)
    duty: list[float] = field(default_factory=lambda: [12.5, 50.0, 75.0, 99.0])  # per chip
    delay_s: float = 0.0  # answer late (a hung service)
    missing: set[str] = field(default_factory=set)  # metric names answered with NOT_FOUND
    calls: int = 0


class _Servicer(pb_grpc.RuntimeMetricServiceServicer):
    def __init__(self, served: Served) -> None:
        self.served = served

    def GetRuntimeMetric(self, request, context):
        s = self.served
        s.calls += 1
        if s.delay_s:
            time.sleep(s.delay_s)
        if request.metric_name in s.missing:
            context.abort(grpc.StatusCode.NOT_FOUND, f"metric {request.metric_name} not found")
        if request.metric_name == MetricName.TOTAL_MEMORY.value:
            gauges = [pb.Gauge(as_int=v) for v in s.total]
        elif request.metric_name == MetricName.MEMORY_USAGE.value:
            gauges = [pb.Gauge(as_int=v) for v in s.used]
        elif request.metric_name == MetricName.DUTY_CYCLE_PCT.value:
            gauges = [pb.Gauge(as_double=v) for v in s.duty]
        else:
            context.abort(grpc.StatusCode.NOT_FOUND, f"metric {request.metric_name} not found")
        # Served in reverse device order: the reader must sort by device id as tpu-info does.
        metrics = [pb.Metric(attribute=pb.Attribute(key="device-id", value=pb.AttrValue(int_attr=i)), gauge=g)
                   for i, g in enumerate(gauges)]
        return pb.MetricResponse(metric=pb.TPUMetric(name=request.metric_name, metrics=metrics[::-1]))


class FakeMetricService:
    """libtpu's RuntimeMetricService on 127.0.0.1 (a free port, or ``port``)."""

    def __init__(self, served: Served | None = None, port: int = 0) -> None:
        self.served = served or Served()
        self._port = port
        self._server: grpc.Server | None = None
        self.port = 0

    def start(self) -> "FakeMetricService":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RuntimeMetricServiceServicer_to_server(_Servicer(self.served), server)
        self.port = server.add_secure_port(f"127.0.0.1:{self._port}", grpc.local_server_credentials())
        assert self.port, "could not bind the fake metrics service"
        self._port = self.port  # a restart comes back on the same port
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None


class Clock:
    """A settable monotonic clock."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        with self._lock:
            self.t += dt

"""Host and device memory samples, taken on the agent thread.

Host: process RSS, available/total memory, process CPU, from /proc through descriptors kept open
(:mod:`tpuwatch.agent.proc_stats`, ~10 µs), or psutil where there is no /proc (~120 µs), every
``host_interval_s``. Devices: ``tf.config.experimental.get_memory_info`` (current/peak,
10-40 µs), only once the script has initialised TF's runtime: asking earlier would initialise
it ourselves, and the script's later ``tf.config.set_logical_device_configuration`` would fail
with "Virtual devices cannot be modified after being initialized" (``Context`` checks
``_context_handle``, set by ``ensure_initialized``).

Limits: TF reports none. GPU: the logical device's configured ``memory_limit``, else NVML total
(when ``pynvml`` is importable), else unknown. TPU: the chip table in
:mod:`tpuwatch.agent.environment`. CPU: none; the host's memory is the limit (HostSample).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Callable

from tpuwatch.agent import clocks, proc_stats
from tpuwatch.protocol import DeviceSample, EventFact, HostSample, Message

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.patches import Patches

PROBE = "memory"
_MIB = 1 << 20


def tf_runtime() -> Any:
    """TF's eager Context once the script has initialised it, else ``None`` (never initialises).

    ``_initialized`` is set after ``_context_handle`` and the logical device list, under TF's
    init lock, so a ready context can be listed from this thread without side effects.
    """
    # The script may be importing TF right now on its thread: a module still being imported
    # is in sys.modules already, half-built (its spec says _initializing).
    tf = sys.modules.get("tensorflow")
    context = sys.modules.get("tensorflow.python.eager.context")
    if tf is None or context is None or _importing(tf) or _importing(context):
        return None
    ctx = context.context_safe()
    if ctx is None or not getattr(ctx, "_initialized", False) or getattr(ctx, "_context_handle", None) is None:
        return None
    return ctx


def _importing(module: Any) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


class MemorySampler:
    def __init__(
        self,
        agent: "Agent",
        host_interval_s: float = 0.5,
        clock: Callable[[], float] = clocks.monotonic,
    ) -> None:
        self.agent = agent
        self.host_interval_s = host_interval_s
        self.clock = clock
        self._next_host = 0.0
        self._process: Any = None
        self._devices: list[tuple[str, int | None, str]] | None = None  # (name, limit, source)
        self._failed_devices: set[str] = set()
        self._seen_logical: Any = None
        # Imported here, on the script's thread, never first on the agent's: there psutil's imports
        # (datetime, subprocess...) deadlocked against the script's own import of TensorFlow
        # (TF 2.16 imports setuptools -> plistlib -> datetime), hanging the script at start.
        import psutil

        from tpuwatch.agent import tpu_metrics

        self._psutil = psutil
        self._tpu_metrics = tpu_metrics
        self._proc = proc_stats.proc_stats()  # None: psutil answers

    def __call__(self) -> list[Message]:
        out: list[Message] = []
        now = self.clock()
        if now >= self._next_host:
            self._next_host = now + self.host_interval_s
            out.append(self.host_sample())
        ctx = tf_runtime()
        if ctx is not None:
            # A TPU script reconnects the runtime (connect_to_cluster): TF then builds a new
            # logical device list, and the devices are found again.
            logical = getattr(ctx, "_logical_devices", None)
            if logical is not self._seen_logical:
                self._seen_logical = logical
                self._devices = None
            out.extend(self.device_samples())
        return out

    # --- host ------------------------------------------------------------------------------

    def host_sample(self) -> HostSample:
        try:
            load: float | None = os.getloadavg()[0]
        except (AttributeError, OSError):  # Windows has none; a container may hide it
            load = None
        proc = self._proc
        if proc is not None:
            try:
                available, total = proc.host_memory()
                return HostSample(t=self.agent.clock(), rss_bytes=proc.rss(), available_bytes=available,
                                  total_bytes=total, cpu_percent=proc.cpu_percent(), load_1m=load)
            except (OSError, ValueError, IndexError):  # /proc went away (a sandbox): psutil from now on
                self._proc = None
        psutil = self._psutil
        if self._process is None:
            self._process = psutil.Process(os.getpid())
            self._process.cpu_percent(None)  # the first call only starts the measurement
        with self._process.oneshot():
            rss = self._process.memory_info().rss
            cpu = self._process.cpu_percent(None)
        vm = psutil.virtual_memory()
        return HostSample(t=self.agent.clock(), rss_bytes=int(rss), available_bytes=int(vm.available),
                          total_bytes=int(vm.total), cpu_percent=float(cpu), load_1m=load)

    # --- devices ---------------------------------------------------------------------------

    def device_samples(self) -> list[DeviceSample]:
        import tensorflow as tf

        if self._devices is None:
            self._devices = self._discover(tf)
        out = []
        covered = self._tpu_metrics.covered_devices(self.agent)  # libtpu's figures win while it answers
        for name, limit, limit_source in self._devices:
            if name in self._failed_devices or name in covered:
                continue
            try:
                info = tf.config.experimental.get_memory_info(name)
            except (ValueError, tf.errors.OpError) as e:
                # Some device types do not track memory: say so once, keep the others.
                self._failed_devices.add(name)
                reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
                self.agent.event("info", f"probe:{PROBE}", f"no memory info for {name}: {reason}",
                                 fact=EventFact.DEVICE_MEMORY_UNAVAILABLE, subject=name, reason=reason)
                continue
            out.append(DeviceSample(
                t=self.agent.clock(), device=name, current_bytes=int(info.get("current", 0)),
                peak_bytes=int(info.get("peak", 0)), limit_bytes=limit, source="tf",
                limit_source=limit_source,
            ))
        return out

    def _discover(self, tf: Any) -> list[tuple[str, int | None, str]]:
        logical = tf.config.list_logical_devices()  # runtime already initialised: no side effect
        kinds = {d.device_type for d in logical}
        devices: list[tuple[str, int | None, str]] = []
        if "TPU" in kinds:
            from tpuwatch.agent import environment

            limit, source = environment.hbm_limit(environment.tpu_device_kind())
            tpus = sorted((d for d in logical if d.device_type == "TPU"), key=_index)
            devices += [(f"TPU:{_index(d)}", limit, source) for d in tpus]
        if "GPU" in kinds:
            limits = gpu_limits(tf)
            gpus = sorted((d for d in logical if d.device_type == "GPU"), key=_index)
            for d in gpus:
                limit, source = limits.get(_index(d), (None, ""))
                devices.append((f"GPU:{_index(d)}", limit, source))
        # All logical CPU devices share one allocator (their get_memory_info figures are the
        # same), so one "CPU:0" sample stands for all; its limit is the host's memory.
        if "CPU" in kinds:
            devices.append(("CPU:0", None, ""))
        return devices


def _index(device: Any) -> int:
    return int(device.name.rsplit(":", 1)[-1])


def gpu_limits(tf: Any) -> dict[int, tuple[int | None, str]]:
    """Logical GPU index -> (limit bytes, source), in TF's logical numbering.

    A physical GPU split into logical devices gives one logical GPU per configuration, in order.
    """
    out: dict[int, tuple[int | None, str]] = {}
    logical_index = 0
    nvml = _nvml_totals()
    for physical_index, physical in enumerate(tf.config.get_visible_devices("GPU")):
        configs = tf.config.get_logical_device_configuration(physical) or [None]
        for config in configs:
            mib = getattr(config, "memory_limit", None) if config is not None else None
            if mib is not None:
                out[logical_index] = (int(mib) * _MIB, "memory_limit")
            elif physical_index in nvml:
                out[logical_index] = (nvml[physical_index], "nvml")
            else:
                out[logical_index] = (None, "")
            logical_index += 1
    return out


def _nvml_totals() -> dict[int, int]:
    """NVML total memory by index of visible GPU (CUDA_VISIBLE_DEVICES order), if pynvml exists."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        indices = [int(i) for i in visible.split(",") if i.strip().isdigit()] if visible else list(range(count))
        return {n: int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total)
                for n, i in enumerate(indices) if i < count}
    except pynvml.NVMLError:
        return {}  # no driver / no permission: limits stay unknown


def install(agent: "Agent", patches: "Patches") -> MemorySampler:
    """Registers the memory sampler. Patches nothing (``patches`` for a uniform signature)."""
    sampler = MemorySampler(agent)
    agent.add_sampler(PROBE, sampler)
    return sampler

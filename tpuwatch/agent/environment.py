"""Who runs what, on which devices: the Hello and Topology messages, mixed precision, TPU HBM.

Nothing here imports TensorFlow or Keras at module import; :func:`hello` reads versions from
package metadata when the script has not imported them yet (importing TF to learn its version
would cost seconds before the script starts).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import socket
import sys
import threading
import weakref
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from tpuwatch import protocol, units
from tpuwatch.agent import clocks
from tpuwatch.protocol import Config, Hello, Topology

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.patches import Patches

PROBE = "environment"

_GIB = 1 << 30

#: HBM per TensorFlow TPU device, by chip type: (GiB per chip, TF devices per chip).
#: v2/v3 chips have two TensorCores, each its own TF device with half the chip's HBM; from v4
#: on, one device per chip (v4/v5p megacore), except v7x. Sources: Cloud TPU "System
#: architecture" pages (cloud.google.com/tpu/docs/v2 ... /v6e, /tpu7x) and the same table in
#: the tpu-info package (tpu_info.device.TpuChip, v0.14).
HBM_BYTES_BY_CHIP: dict[str, tuple[int, int]] = {
    "v2": (16 * _GIB, 2),
    "v3": (32 * _GIB, 2),
    "v4": (32 * _GIB, 1),
    "v5e": (16 * _GIB, 1),
    "v5p": (95 * _GIB, 1),
    "v6e": (32 * _GIB, 1),
    "7x": (192 * _GIB, 2),
}

# Names chips go by: JAX/PJRT device_kind ("TPU v5 lite"), accelerator types ("v5litepod-8"),
# tpu-info ("TPU v6e chip"), marketing names.
_CHIP_ALIASES = {
    "v2": "v2", "v3": "v3", "v4": "v4", "v4i": "v4",
    "v5e": "v5e", "v5lite": "v5e", "v5litepod": "v5e",
    "v5p": "v5p", "v5": "v5p",
    "v6e": "v6e", "v6lite": "v6e", "v6": "v6e", "trillium": "v6e",
    "7x": "7x", "v7x": "7x", "v7": "7x", "ironwood": "7x",
}

_TPU_STRATEGY_CLASSES = frozenset({"TPUStrategy", "TPUStrategyV2", "TPUStrategyV1"})


# --- TPU chips -------------------------------------------------------------------------------


def chip_type(name: str) -> str | None:
    """Canonical chip type ("v4", "v5e", ...) from any common spelling, or ``None``."""
    text = name.strip().lower()
    text = text.split("-")[0] if text[:1] == "v" else text  # "v5litepod-16" -> "v5litepod"
    for noise in ("chip", "tpu", " "):
        text = text.replace(noise, "")
    text = text.split("-")[0]
    return _CHIP_ALIASES.get(text)


def hbm_limit(device_kind: str) -> tuple[int | None, str]:
    """HBM bytes of one TF TPU device of ``device_kind`` (e.g. "TPU v4"), and where it came from."""
    chip = chip_type(device_kind)
    if chip is None:
        return None, ""
    per_chip, devices_per_chip = HBM_BYTES_BY_CHIP[chip]
    return per_chip // devices_per_chip, f"chip table {chip}"


def tpu_device_kind() -> str:
    """"TPU v4"-style name of this host's TPU chips, or "TPU" when it cannot be told."""
    # tpu-info reads PCI ids from sysfs: no TF, no TPU runtime call.
    try:
        from tpu_info import device as tpu_info_device

        chip, count = tpu_info_device.get_local_chips()
        if chip is not None and count:
            name = chip.value.name
            return "TPU7x" if name == "7x" else f"TPU {name}"
    except ImportError:
        pass
    except (OSError, AssertionError, ValueError):
        pass  # unreadable sysfs or mixed chips: fall through to the next source
    for var in ("TPU_ACCELERATOR_TYPE", "ACCELERATOR_TYPE"):
        chip = chip_type(os.environ.get(var, ""))
        if chip is not None:
            return "TPU7x" if chip == "7x" else f"TPU {chip}"
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        try:
            for dev in tf.config.list_physical_devices("TPU"):
                details = tf.config.experimental.get_device_details(dev)
                for key in ("device_kind", "device_name"):
                    chip = chip_type(str(details.get(key, "")))
                    if chip is not None:
                        return "TPU7x" if chip == "7x" else f"TPU {chip}"
        except (ValueError, RuntimeError):
            pass  # no details for this device type
    return "TPU"


# --- Hello -----------------------------------------------------------------------------------


def _version(module: str, distributions: Iterable[str]) -> str:
    loaded = sys.modules.get(module)
    version = getattr(loaded, "__version__", None) if loaded is not None else None
    if isinstance(version, str):
        return version
    for dist in distributions:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def tf_version() -> str:
    return _version("tensorflow", ("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-nightly"))


def keras_version() -> str:
    if _legacy_keras():
        return _version("tf_keras", ("tf-keras", "tf-keras-nightly"))
    return _version("keras", ("keras", "keras-nightly"))


def _legacy_keras() -> bool:
    return os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes")


def tf_config(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The parsed ``TF_CONFIG``, or ``None`` when unset. Raises ValueError when malformed."""
    raw = (environ if environ is not None else os.environ).get("TF_CONFIG", "").strip()
    if not raw:
        return None
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError("TF_CONFIG must be a JSON object")
    return config


def worker_position(cluster: Mapping[str, Any], task_type: str | None, task_id: int | None) -> tuple[int, int]:
    """(number of training workers, this task's index) in a cluster spec.

    Training workers are the "chief" (index 0 when present) and the "worker" tasks, as
    MultiWorkerMirroredStrategy counts them; "ps" and "evaluator" tasks do not train replicas.
    """
    chiefs = len(cluster.get("chief", ()) or ())
    workers = len(cluster.get("worker", ()) or ())
    total = max(chiefs + workers, 1)
    if task_type == "chief":
        return total, int(task_id or 0)
    if task_type == "worker":
        return total, chiefs + int(task_id or 0)
    return total, 0


def worker_name(host: str, pid: int, environ: Mapping[str, str] | None = None) -> str:
    """"worker:1" from TF_CONFIG's task, else "host:pid"."""
    try:
        config = tf_config(environ)
    except ValueError:
        config = None  # the strategy will report the malformed TF_CONFIG itself
    task = config.get("task") if config else None
    if isinstance(task, dict) and task.get("type") is not None:
        return f"{task.get('type')}:{task.get('index', 0)}"
    return f"{host}:{pid}"


def hello(run_id: str, script: str, argv: Iterable[str], clock: Callable[[], float] = clocks.wall) -> Hello:
    from tpuwatch import __version__

    host = socket.gethostname()
    pid = os.getpid()
    return Hello(
        protocol_version=protocol.PROTOCOL_VERSION,
        agent_version=__version__,
        run_id=run_id,
        t=clock(),
        pid=pid,
        host=host,
        worker=worker_name(host, pid),
        python_version=platform.python_version(),
        tf_version=tf_version(),
        keras_version=keras_version(),
        script=script,
        argv=tuple(protocol.clip_argv(argv)),
    )


# --- Topology --------------------------------------------------------------------------------


def is_tpu_strategy(strategy: Any) -> bool:
    """By class name through the MRO, so it needs no TPU (and no TPU import) to answer."""
    return any(cls.__name__ in _TPU_STRATEGY_CLASSES for cls in type(strategy).__mro__)


def local_cpu_replicas(strategy: Any) -> tuple[tuple[str, bool], ...] | None:
    """``strategy``'s replica devices, in order, each with whether it is the host's ``CPU:0``,
    where every one is a CPU of this host (a MirroredStrategy over logical CPUs) and there are
    several; else None, as on anything unexpected."""
    try:
        from tensorflow.python.framework import device as device_lib

        devices = tuple(strategy.extended.worker_devices)
        if len(devices) < 2:
            return None
        parts = []
        for d in devices:
            spec = device_lib.DeviceSpec.from_string(d)
            if (spec.device_type or "").upper() != "CPU" or spec.job not in (None, "localhost"):
                return None
            parts.append((d, (spec.device_index or 0) == 0))
        return tuple(parts)
    except Exception:  # a strategy with no worker_devices, a device string TF parses otherwise
        return None


def _replica_devices(strategy: Any) -> tuple[str, ...]:
    try:
        devices = tuple(strategy.extended.worker_devices)
    except (RuntimeError, AttributeError, NotImplementedError):
        # The default strategy has no worker_devices: it runs on TF's default device.
        devices = ()
    if devices:
        return tuple(units.device_name(d) for d in devices)
    import tensorflow as tf

    # Physical devices only: listing logical ones would initialise the runtime.
    return ("GPU:0",) if tf.config.list_physical_devices("GPU") else ("CPU:0",)


def _workers(strategy: Any, is_tpu: bool) -> tuple[int, int]:
    if is_tpu:
        # TPUStrategy is single-client: this one process drives every host's cores.
        return 1, 0
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is not None:
        try:
            cluster = resolver.cluster_spec().as_dict()
            if cluster:
                return worker_position(cluster, resolver.task_type, resolver.task_id)
        except (AttributeError, ValueError, TypeError):
            pass  # an unusual resolver: fall back to TF_CONFIG
    config = tf_config()
    if config and isinstance(config.get("cluster"), dict):
        task = config.get("task") or {}
        return worker_position(config["cluster"], task.get("type"), task.get("index"))
    return 1, 0


def topology(strategy: Any, clock: Callable[[], float] = clocks.wall) -> Topology:
    """The Topology of any tf.distribute strategy (default strategy included)."""
    is_tpu = is_tpu_strategy(strategy)
    devices = _replica_devices(strategy)
    num_workers, worker_index = _workers(strategy, is_tpu)
    if is_tpu:
        kind = tpu_device_kind()
    elif any(d.startswith("GPU") for d in devices):
        kind = "GPU"
    else:
        kind = devices[0].split(":")[0] if devices else "CPU"
    return Topology(
        t=clock(),
        strategy=type(strategy).__name__,
        replicas=int(strategy.num_replicas_in_sync),
        local_replicas=len(devices),
        num_workers=num_workers,
        worker_index=worker_index,
        device_kind=kind,
        devices=devices,
        is_tpu=is_tpu,
    )


_announced: "weakref.WeakSet[Any]" = weakref.WeakSet()
_announce_lock = threading.Lock()
# The strategy of the last training step (a weak reference), once the script has trained, and
# the strategy of the last Topology emitted.
_training: "weakref.ref[Any] | None" = None
_last: "weakref.ref[Any] | None" = None


def _emit(agent: "Agent", strategy: Any) -> None:
    global _last
    try:
        _last = weakref.ref(strategy)
    except TypeError:
        _last = None
    topo = topology(strategy, clock=agent.clock)
    agent.num_workers = topo.num_workers  # the auto-profile captures only where one worker trains
    agent.emit(topo)


def announce(agent: "Agent", strategy: Any) -> None:
    """Emits the Topology of ``strategy`` once per strategy object, until the script trains.

    Before the first training step the latest strategy made or used is the best guess; after
    it, only :func:`training_strategy` speaks (a model evaluated under another strategy must
    not relabel the run)."""
    if _training is not None or strategy in _announced:
        return
    with _announce_lock:
        if strategy in _announced:
            return
        _announced.add(strategy)
    _emit(agent, strategy)


def training_strategy(agent: "Agent", strategy: Any) -> None:
    """A training step ran under ``strategy``: emits its Topology when it is not the strategy of
    the previous training step (the steps after a Topology belong to it)."""
    global _training
    if _training is not None and _training() is strategy:
        return
    try:
        _training = weakref.ref(strategy)
    except TypeError:
        return
    _announced.add(strategy)
    if _last is None or _last() is not strategy:
        _emit(agent, strategy)


# --- mixed precision -------------------------------------------------------------------------


class PolicyWatcher:
    """Emits a Config when the Keras global dtype policy changes.

    Keras 3 keeps its global policy in a ``threading.local`` (keras.src.backend.common.
    global_state), so a sampler on the agent thread would always read the default: the
    policy is read on the training thread instead, by :meth:`check` (called by the Keras hooks
    at train begin and after ``set_global_attribute``). Legacy tf_keras keeps a plain module
    global, which :meth:`sample` can read from the agent thread.
    """

    def __init__(self, agent: "Agent") -> None:
        self.agent = agent
        self.last: str | None = None
        self._lock = threading.Lock()

    def current(self) -> str | None:
        """The policy name, reading only modules the script has imported, changing nothing."""
        legacy = sys.modules.get("tf_keras")
        if legacy is not None and (_legacy_keras() or "keras" not in sys.modules):
            policy = legacy.mixed_precision.global_policy()
            return getattr(policy, "name", None)
        state = sys.modules.get("keras.src.backend.common.global_state")
        if state is None:
            return None
        # Not keras.config.dtype_policy(): with no policy set it stores a default one, which
        # would pin the policy before a later keras.config.set_floatx() in the script.
        policy = state.get_global_attribute("dtype_policy", None)
        if policy is not None:
            return getattr(policy, "name", None)
        config = getattr(sys.modules.get("keras"), "config", None)
        return config.floatx() if config is not None and hasattr(config, "floatx") else None

    def check(self, name: str | None = None) -> None:
        """Emits a Config if the policy changed; reads it on the calling thread unless given."""
        if name is None:
            name = self.current()
        if name is None:
            return
        with self._lock:
            if name == self.last:
                return
            self.last = name
        self.agent.emit(Config(t=self.agent.clock(), mixed_precision=name))

    def sample(self) -> list[protocol.Message]:
        # Only tf_keras's policy is visible from the agent thread (see the class docstring).
        legacy = sys.modules.get("tf_keras")
        if legacy is None or getattr(getattr(legacy, "__spec__", None), "_initializing", False):
            return []  # absent, or being imported right now on the script's thread
        if _legacy_keras() or "keras" not in sys.modules:
            self.check()
        return []


_watchers: "weakref.WeakKeyDictionary[Any, PolicyWatcher]" = weakref.WeakKeyDictionary()


def policy_watcher(agent: "Agent") -> PolicyWatcher:
    """The one PolicyWatcher of ``agent`` (shared by the environment and Keras probes)."""
    watcher = _watchers.get(agent)
    if watcher is None:
        watcher = _watchers[agent] = PolicyWatcher(agent)
    return watcher


# --- install ---------------------------------------------------------------------------------


def install(agent: "Agent", patches: "Patches") -> None:
    """Announces a strategy when its scope is entered; watches the mixed-precision policy."""
    from tensorflow.python.distribute import distribute_lib

    def make_scope(original: Callable[..., Any]) -> Callable[..., Any]:
        def scope(self: Any, *args: Any, **kwargs: Any) -> Any:
            manager = original(self, *args, **kwargs)
            if agent.enabled(PROBE):
                try:
                    # The default strategy's scope is entered by TF/Keras internals all the
                    # time; the step probe announces it if it is what actually trains.
                    if self not in _announced and type(self).__name__ != "_DefaultDistributionStrategy":
                        announce(agent, self)
                except Exception as e:  # the script's scope is entered already: only the probe stops
                    agent.probe_failed(PROBE, e)
            return manager

        return scope

    patches.wrap(distribute_lib.StrategyBase, "scope", make_scope)
    watcher = policy_watcher(agent)
    agent.add_sampler("mixed_precision", watcher.sample)
    _watch_keras3_policy(agent, patches, watcher)


def _watch_keras3_policy(agent: "Agent", patches: "Patches", watcher: PolicyWatcher) -> None:
    """Hooks Keras 3's global-state setter (where set_dtype_policy stores the policy) when the
    script imports Keras; the hook runs on the thread that sets it."""
    from tpuwatch.agent import post_import

    def patch(module: ModuleType) -> None:
        def make_setter(original: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
            def set_global_attribute(name: str, value: Any) -> Any:
                result = original(name, value)
                if name == "dtype_policy" and agent.enabled("mixed_precision"):
                    try:
                        watcher.check(getattr(value, "name", None))
                    except Exception as e:  # Keras has set the policy already: only the probe stops
                        agent.probe_failed("mixed_precision", e)
                return result

            return set_global_attribute

        patches.wrap(module, "set_global_attribute", make_setter)

    post_import.when_imported(
        "keras.src.backend.common.global_state", patch,
        on_error=lambda e: agent.probe_failed("mixed_precision", e),
    )

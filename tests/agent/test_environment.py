"""Hello, Topology, TPU tables and the mixed-precision watcher."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tpuwatch import protocol
from tpuwatch.agent import environment

REPO = Path(__file__).resolve().parents[2]


# --- pure functions ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, chip",
    [
        ("TPU v4", "v4"),
        ("TPU v5 lite", "v5e"),
        ("v5litepod-16", "v5e"),
        ("TPU v5e chip", "v5e"),
        ("TPU v5p", "v5p"),
        ("v6e-8", "v6e"),
        ("Trillium", "v6e"),
        ("TPU v2", "v2"),
        ("TPU7x", "7x"),
        ("TPU", None),
        ("GPU", None),
    ],
)
def test_chip_type_spellings(kind, chip):
    assert environment.chip_type(kind) == chip


def test_hbm_limit_is_per_tf_device():
    gib = 1 << 30
    assert environment.hbm_limit("TPU v4") == (32 * gib, "chip table v4")
    assert environment.hbm_limit("TPU v3") == (16 * gib, "chip table v3")  # 2 cores per chip
    assert environment.hbm_limit("TPU v5 lite") == (16 * gib, "chip table v5e")
    assert environment.hbm_limit("TPU v5p") == (95 * gib, "chip table v5p")
    assert environment.hbm_limit("TPU v6e") == (32 * gib, "chip table v6e")
    assert environment.hbm_limit("TPU") == (None, "")


def test_is_tpu_by_class_name_without_a_tpu():
    TPUStrategyV2 = type("TPUStrategyV2", (), {})
    Sub = type("MyTPUStrategy", (TPUStrategyV2,), {})
    assert environment.is_tpu_strategy(TPUStrategyV2())
    assert environment.is_tpu_strategy(Sub())
    assert not environment.is_tpu_strategy(type("MirroredStrategy", (), {})())


def test_tf_config_parsing_and_worker_positions():
    cluster = {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]}
    assert environment.worker_position(cluster, "chief", 0) == (3, 0)
    assert environment.worker_position(cluster, "worker", 1) == (3, 2)
    assert environment.worker_position({"worker": ["a", "b"]}, "worker", 1) == (2, 1)
    env = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}})}
    assert environment.tf_config(env)["task"]["index"] == 1
    assert environment.worker_name("h", 7, env) == "worker:1"
    assert environment.worker_name("h", 7, {}) == "h:7"
    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        environment.tf_config({"TF_CONFIG": "{nope"})
    assert environment.worker_name("h", 7, {"TF_CONFIG": "{nope"}) == "h:7"


def test_device_name_is_the_form_memory_samples_use():
    from tpuwatch import units

    assert units.device_name("/job:localhost/replica:0/task:0/device:CPU:3") == "CPU:3"
    assert units.device_name("/job:worker/replica:0/task:1/device:TPU:0") == "TPU:0"


@pytest.mark.tf
def test_hello_without_importing_tensorflow(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    hello = environment.hello("r1", "train.py", ["train.py", "--x"], clock=lambda: 12.5)
    assert hello.protocol_version == protocol.PROTOCOL_VERSION
    assert hello.t == 12.5 and hello.pid == os.getpid() and hello.host == socket.gethostname()
    assert hello.worker == f"{socket.gethostname()}:{os.getpid()}"
    assert hello.tf_version.startswith("2.") and hello.keras_version.startswith("3.")
    assert hello.argv == ("train.py", "--x")
    assert protocol.decode(protocol.encode(hello)) == hello


# --- real TensorFlow (fresh interpreter: 4 logical CPUs must be set before TF starts) -----

_TOPOLOGY_SCRIPT = textwrap.dedent(
    """
    import json, sys, pathlib, time
    from tpuwatch import protocol
    from tpuwatch.agent import environment
    from tpuwatch.agent.patches import Patches
    from tpuwatch.agent.runtime import Agent

    run_dir = pathlib.Path(sys.argv[1])
    agent = Agent(run_dir=run_dir, run_id="t")
    patches = Patches()
    environment.install(agent, patches)

    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
    out = {}
    out["default"] = protocol.to_dict(environment.topology(tf.distribute.get_strategy()))
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2", "CPU:3"])
    out["mirrored"] = protocol.to_dict(environment.topology(strategy))
    with strategy.scope():
        pass
    with strategy.scope():
        v = tf.Variable(1.0)
    environment.announce(agent, strategy)  # again: still once
    with tf.distribute.get_strategy().scope():
        pass  # the default strategy's scope is not announced

    import keras
    keras.config.set_dtype_policy("mixed_bfloat16")
    keras.config.set_dtype_policy("mixed_bfloat16")
    keras.config.set_dtype_policy("float32")
    agent.stop()
    patches.restore()
    out["events"] = [protocol.to_dict(protocol.decode(l)) for l in (run_dir / "events.jsonl").read_bytes().splitlines()]
    print("RESULT " + json.dumps(out))
    """
)


@pytest.mark.tf
def test_topology_and_announcements_with_real_strategies(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", _TOPOLOGY_SCRIPT, str(tmp_path)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])

    mirrored = out["mirrored"]
    assert mirrored["strategy"] == "MirroredStrategy"
    assert mirrored["replicas"] == 4 and mirrored["local_replicas"] == 4
    assert mirrored["devices"] == ["CPU:0", "CPU:1", "CPU:2", "CPU:3"]
    assert mirrored["is_tpu"] is False and mirrored["device_kind"] == "CPU"
    assert (mirrored["num_workers"], mirrored["worker_index"]) == (1, 0)

    default = out["default"]
    assert default["strategy"] == "_DefaultDistributionStrategy"
    assert default["replicas"] == 1 and default["devices"] == ["CPU:0"]

    events = out["events"]
    topologies = [e for e in events if e["kind"] == "topology"]
    assert [t["strategy"] for t in topologies] == ["MirroredStrategy"]
    policies = [e["mixed_precision"] for e in events if e["kind"] == "config"]
    assert policies == ["mixed_bfloat16", "float32"]
    assert [e for e in events if e["kind"] == "event"] == []


class _FakeAgent:
    def __init__(self):
        self.sent = []
        self.clock = lambda: 1.0

    def emit(self, msg):
        self.sent.append(msg)


def test_policy_watcher_reads_nothing_when_keras_is_absent(monkeypatch):
    for name in ("keras", "tf_keras", "keras.src.backend.common.global_state"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    agent = _FakeAgent()
    watcher = environment.PolicyWatcher(agent)
    assert watcher.current() is None
    assert watcher.sample() == [] and agent.sent == []
    watcher.check("mixed_float16")
    watcher.check("mixed_float16")
    assert [m.mixed_precision for m in agent.sent] == ["mixed_float16"]

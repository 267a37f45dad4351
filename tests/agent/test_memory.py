"""Memory sampler: host figures, the CPU allocator, and never initialising TF early."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tpuwatch import protocol
from tpuwatch.agent import memory
from tpuwatch.agent.runtime import Agent

REPO = Path(__file__).resolve().parents[2]


def test_host_sample_is_sane_and_rate_limited(tmp_path):
    agent = Agent(run_dir=tmp_path, run_id="t")
    now = [100.0]
    sampler = memory.MemorySampler(agent, host_interval_s=0.5, clock=lambda: now[0])
    first = [m for m in sampler() if isinstance(m, protocol.HostSample)]
    assert len(first) == 1
    host = first[0]
    vm = psutil.virtual_memory()
    assert 10 * (1 << 20) < host.rss_bytes < vm.total
    assert host.total_bytes == vm.total
    assert 0 < host.available_bytes <= host.total_bytes
    assert host.cpu_percent >= 0.0
    assert host.load_1m is not None and host.load_1m >= 0.0  # the host's load, beside the process's CPU%
    now[0] += 0.25
    assert [m for m in sampler() if isinstance(m, protocol.HostSample)] == []
    now[0] += 0.3
    assert len([m for m in sampler() if isinstance(m, protocol.HostSample)]) == 1
    agent.stop()


_SCRIPT = textwrap.dedent(
    """
    import json, pathlib, sys, time
    from tpuwatch import protocol
    from tpuwatch.agent import memory
    from tpuwatch.agent.patches import Patches
    from tpuwatch.agent.runtime import Agent

    run_dir = pathlib.Path(sys.argv[1])
    agent = Agent(run_dir=run_dir, run_id="t", sample_hz=20)
    memory.install(agent, Patches())
    agent.start()
    import tensorflow as tf          # the script imports TF while the sampler runs...
    time.sleep(0.6)                  # ...and several samples pass before it configures devices
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
    before = len(tf.config.list_logical_devices("CPU"))
    big = tf.ones((64, 1024, 1024))  # 256 MiB
    time.sleep(0.6)
    timed = memory.MemorySampler(agent)
    timed()  # discovery
    t0 = time.perf_counter()
    for _ in range(200):
        timed.device_samples()
    per_call_us = (time.perf_counter() - t0) / 200 * 1e6
    agent.stop()
    msgs = [protocol.to_dict(protocol.decode(l)) for l in (run_dir / "events.jsonl").read_bytes().splitlines()]
    print("RESULT " + json.dumps({"cpus": before, "messages": msgs, "device_sample_us": per_call_us,
                                  "big": float(tf.reduce_sum(big[0, 0, :2]))}), flush=True)
    import os
    os._exit(0)  # TF's interpreter teardown can hang (seen with TF 2.16 here); not what this tests
    """
)


@pytest.mark.tf
def test_device_samples_start_after_the_script_configures_devices(tmp_path):
    def run(**extra: str) -> dict:
        run_dir = tmp_path / f"run{len(extra)}"
        run_dir.mkdir()
        proc = subprocess.run(
            [sys.executable, "-c", _SCRIPT, str(run_dir)],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", **extra},
            capture_output=True, text=True, timeout=180,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.split("RESULT ", 1)[1])

    out = run()
    if any("Allocator stats not available" in m.get("message", "") for m in out["messages"]):
        # TF keeps allocator statistics on CPU only with its BFC allocator, which it does not use
        # by default on some CPUs (AMD here). The agent must then say so, and sample nothing.
        assert not [m for m in out["messages"] if m["kind"] == "device_sample"]
        tf_version = tuple(int(p) for p in importlib.metadata.version("tensorflow").split(".")[:2])
        if tf_version < (2, 21):
            return  # TF 2.16 with TF_CPU_ALLOCATOR_USE_BFC=1 hung in this script on this box
        out = run(TF_CPU_ALLOCATOR_USE_BFC="1")
    assert out["cpus"] == 4  # set_logical_device_configuration did not fail
    msgs = out["messages"]
    hosts = [m for m in msgs if m["kind"] == "host_sample"]
    devices = [m for m in msgs if m["kind"] == "device_sample"]
    assert len(hosts) >= 2
    assert devices, "no device samples after TF initialised"
    assert {d["device"] for d in devices} == {"CPU:0"}  # one sample for the shared allocator
    assert all(d["limit_bytes"] is None for d in devices)
    assert max(d["current_bytes"] for d in devices) >= 256 * (1 << 20)
    assert max(d["peak_bytes"] for d in devices) >= max(d["current_bytes"] for d in devices)
    assert [m for m in msgs if m["kind"] == "event"] == []
    print(f"device sample: {out['device_sample_us']:.0f} us per call")


def test_no_runtime_means_no_device_samples(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "tf_runtime", lambda: None)
    agent = Agent(run_dir=tmp_path, run_id="t")
    sampler = memory.MemorySampler(agent)
    assert [type(m) for m in sampler()] == [protocol.HostSample]
    agent.stop()


_IMPORT_SPY = textwrap.dedent(
    """
    import sys, threading
    seen = []

    class Spy:
        def find_spec(self, name, path=None, target=None):
            if threading.current_thread().name == "tpuwatch-agent":
                seen.append(name)
            return None

    sys.meta_path.insert(0, Spy())
    """
)


@pytest.mark.tf
def test_the_agent_thread_imports_nothing_while_the_script_imports(tmp_path):
    """The agent's thread imported psutil (and with it datetime, subprocess, locale...) at its
    first host sample, while the script imported TensorFlow on the main thread: on TF 2.16 (which
    imports setuptools -> plistlib -> datetime) the two imports deadlocked, and the script hung
    at start (1 run in 8 here). Every module the agent's thread needs is imported before it starts."""
    (tmp_path / "import_spy.py").write_text(_IMPORT_SPY)
    (tmp_path / "sitecustomize.py").write_text("import import_spy\n")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(
        """
        import time
        import tensorflow as tf
        tf.constant(1.0) + 1.0  # the runtime starts: device samples begin
        time.sleep(1.0)         # several samples, records drained
        import import_spy
        print("AGENT THREAD IMPORTED", sorted(set(import_spy.seen)), flush=True)
        """
    ))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), "TF_CPP_MIN_LOG_LEVEL": "2",
           "TPUWATCH_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "tpuwatch.agent", str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("AGENT THREAD IMPORTED"))
    assert line == "AGENT THREAD IMPORTED []", line

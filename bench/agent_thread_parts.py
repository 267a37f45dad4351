"""What the agent's own thread spends its CPU on, part by part, at the tiny step.

    python bench/agent_thread_parts.py [--steps 2000] [--replicas 4] [--sample-hz 4]

``bench/overhead.py`` gives the agent thread's CPU a step as one figure, measured while training
runs on both cores (where every thread's CPU time is inflated by the other's). This bench runs the
same tiny custom loop with every probe installed but does the agent thread's work itself, on the
training thread between steps, one part at a time: each sampler once a sample period (a period
being ``steps per second / sample rate`` steps of the loop), and the drain that encodes the
buffered records, hands the Steps to the taps and writes them. Each part is timed with the
thread's own CPU clock, so the figures hold on a shared box; they are the parts' costs without
contention, and their sum says how much of the contended figure the work itself explains.
Prints µs of CPU a training step for each part, and the load.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--sample-hz", type=float, default=4.0)
    a = p.parse_args()

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
    from _custom_loop import custom_loop

    from tpuwatch.agent import probes
    from tpuwatch.agent.runtime import Agent

    agent = Agent(Path(tempfile.mkdtemp(prefix="tpuwatch-parts-")), "parts", sample_hz=a.sample_hz)
    patches = probes.install_all(agent, "parts", ["parts"], set())
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(a.replicas)])
    step_fn, it = custom_loop(strategy, a.replicas, 8)
    step = tf.function(step_fn)
    for _ in range(100):  # traces, warm-up, the first records' reads
        step(it)
    agent._drain()
    start = time.perf_counter()
    for _ in range(200):
        step(it)
    step_s = (time.perf_counter() - start) / 200
    period = max(1, round(1 / a.sample_hz / step_s))  # steps a sample period holds
    agent._drain()

    samplers = list(agent.samplers._samplers)
    cpu_of: dict[str, float] = {name: 0.0 for name, _ in samplers}
    cpu_of["drain (encode, taps, write)"] = 0.0
    thread_time = time.thread_time
    buf = agent._buf
    done = 0
    while done < a.steps:
        for _ in range(period):
            step(it)
        done += period
        for name, sampler in samplers:
            c = thread_time()
            for msg in sampler():
                buf.append(msg)
            cpu_of[name] += thread_time() - c
        c = thread_time()
        agent._drain()
        cpu_of["drain (encode, taps, write)"] += thread_time() - c
    total = sum(cpu_of.values())
    print(f"{done} steps of {step_s * 1e3:.2f} ms, a sample every {period} steps ({a.sample_hz:g} Hz), "
          f"load {os.getloadavg()[0]:.2f}; the agent thread's work, µs of CPU a training step:")
    for name, s in sorted(cpu_of.items(), key=lambda kv: -kv[1]):
        print(f"  {s / done * 1e6:7.2f}  {name}")
    print(f"  {total / done * 1e6:7.2f}  in all (the budget: 20 µs a step)")
    patches.restore()
    agent.stop()


if __name__ == "__main__":
    main()

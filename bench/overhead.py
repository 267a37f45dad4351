"""What the agent costs a training step: the same loop with and without it, alternating in one process.

The loop is a MirroredStrategy custom loop over 4 logical CPU devices whose step function takes
the distributed iterator and calls ``next()`` inside (the in-graph input-wait, step-count and
per-replica-loss probes all run). Two step functions are traced: one with the agent's patches
installed (it carries the in-graph probes), one without. Blocks alternate: agent patches active +
instrumented function, then patches suspended + plain function. The agent's thread (recording,
sampling) runs throughout, and its CPU time is reported separately.

    python bench/overhead.py [--width 1024] [--blocks 12] [--steps 40]

Prints the ratio (instrumented / plain per-step wall time) and the added microseconds per step,
for a ~20 ms step (``--width``) and for a tiny step (where the fixed cost is easiest to see).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=1024, help="hidden units of the ~20 ms model")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--blocks", type=int, default=12, help="alternating block pairs")
    p.add_argument("--steps", type=int, default=40, help="steps per block")
    a = p.parse_args()

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
    from tpuwatch.agent import probes
    from tpuwatch.agent.runtime import Agent

    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(a.replicas)])
    run_dir = Path(tempfile.mkdtemp(prefix="tpuwatch-bench-"))
    agent = Agent(run_dir, "bench", sample_hz=4)
    patches = probes.install_all(agent, "bench", ["bench"], set())
    agent.start()
    patches.suspend()
    agent_thread = next(t for t in __import__("threading").enumerate() if t.name == "tpuwatch-agent")

    results = {}
    for label, width in (("~20 ms step", a.width), ("tiny step", 8)):
        with strategy.scope():
            model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(width, activation="relu"),
                                         tf.keras.layers.Dense(width, activation="relu"), tf.keras.layers.Dense(1)])
            opt = tf.keras.optimizers.SGD(0.001)
        x = tf.random.normal([4096, 64])
        y = tf.random.normal([4096, 1])
        ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64 * a.replicas, drop_remainder=True)
        it = iter(strategy.experimental_distribute_dataset(ds.prefetch(tf.data.AUTOTUNE)))

        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        def step(iterator):
            x, y = next(iterator)
            return strategy.reduce("MEAN", strategy.run(replica_step, args=(x, y)), axis=None)

        plain = tf.function(step)
        plain(it)  # trace without the agent
        patches.resume()
        instrumented = tf.function(step)
        instrumented(it)  # trace with it: carries the in-graph probes
        patches.suspend()

        def block(fn, n):
            start = time.perf_counter()
            for _ in range(n):
                fn(it)
            return (time.perf_counter() - start) / n

        for _ in range(3):  # warm up both
            block(plain, a.steps)
            patches.resume()
            block(instrumented, a.steps)
            patches.suspend()
        graph_only: list[float] = []
        on, off = [], []
        proc = psutil.Process()
        cpu0 = _thread_cpu(proc, agent_thread.native_id)
        steps0 = agent.global_step
        for i in range(a.blocks):
            order = (True, False) if i % 2 == 0 else (False, True)
            for instrumented_phase in order:
                if instrumented_phase:
                    patches.resume()
                    on.append(block(instrumented, a.steps))
                    patches.suspend()
                else:
                    off.append(block(plain, a.steps))
            # The instrumented graph with the Python patches suspended: what the in-graph probes
            # cost by themselves (the rest of the difference is the Python side).
            graph_only.append(block(instrumented, a.steps))
        agent.flush()
        agent_cpu = _thread_cpu(proc, agent_thread.native_id) - cpu0
        recorded = agent.global_step - steps0
        on_s, off_s = statistics.median(on), statistics.median(off)
        graph_s = statistics.median(graph_only)
        results[label] = (off_s, on_s, agent_cpu / max(recorded, 1))
        print(f"{label:>12}: plain {off_s * 1e3:8.3f} ms/step   with agent {on_s * 1e3:8.3f} ms/step   "
              f"ratio {on_s / off_s:6.4f}   added {(on_s - off_s) * 1e6:+7.1f} µs/step   "
              f"agent thread {agent_cpu / max(recorded, 1) * 1e6:6.1f} µs CPU/step   "
              f"(medians of {a.blocks} blocks x {a.steps} steps; {recorded} steps recorded; "
              f"load {os.getloadavg()[0]:.2f})")
        print(f"{'':>12}  of which in-graph probes {(graph_s - off_s) * 1e6:+7.1f} µs/step, "
              f"Python side {(on_s - graph_s) * 1e6:+7.1f} µs/step")
    patches.resume()
    patches.restore()
    agent.stop()


def _thread_cpu(proc: psutil.Process, tid: int) -> float:
    for t in proc.threads():
        if t.id == tid:
            return t.user_time + t.system_time
    return 0.0


if __name__ == "__main__":
    main()

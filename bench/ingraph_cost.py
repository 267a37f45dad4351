"""What each in-graph probe adds to a tiny step, measured one probe at a time in one process.

The loop is bench/overhead.py's tiny step (MirroredStrategy over logical CPUs, ``next()`` inside
the step function). One step function is traced per variant, with the agent's patches active and
some probes disabled, so each graph carries only that variant's in-graph work; then the patches
are suspended and the variants' graphs are timed in rotating blocks (the Python side is not
measured here: bench/overhead.py does that). Also prints the ops each variant adds to the graph.

    python bench/ingraph_cost.py [--replicas 4] [--rounds 10] [--steps 60]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ALL = ("steps", "input_wait", "examples", "replica_loss")
VARIANTS = {
    "plain (no probes)": None,
    "step count only": ("input_wait", "examples", "replica_loss"),
    "+ input wait": ("examples", "replica_loss"),
    "+ examples": ("replica_loss",),
    "+ replica loss (all)": (),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=60)
    a = p.parse_args()

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
    from tpuwatch.agent import probes
    from tpuwatch.agent.runtime import Agent

    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(a.replicas)])
    agent = Agent(Path(tempfile.mkdtemp(prefix="tpuwatch-bench-")), "bench", sample_hz=4)
    patches = probes.install_all(agent, "bench", ["bench"], set())
    agent.start()
    patches.suspend()

    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(8, activation="relu"),
                                     tf.keras.layers.Dense(1)])
        opt = tf.keras.optimizers.SGD(0.001)
    ds = tf.data.Dataset.from_tensor_slices((tf.random.normal([4096, 64]), tf.random.normal([4096, 1])))
    it = iter(strategy.experimental_distribute_dataset(
        ds.repeat().batch(64 * a.replicas, drop_remainder=True).prefetch(tf.data.AUTOTUNE)))

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    def step(iterator):
        x, y = next(iterator)
        return strategy.reduce("MEAN", strategy.run(replica_step, args=(x, y)), axis=None)

    fns = {}
    ops = {}
    for label, disabled in VARIANTS.items():
        fn = tf.function(step)
        if disabled is not None:
            patches.resume()
            agent._disabled.clear()
            agent._disabled.update({name: "bench" for name in disabled})
        fn(it)
        # The graph traced by that call (asked for while the same patches are active).
        graph_def = fn.get_concrete_function(it).graph.as_graph_def()
        agent._disabled.clear()
        patches.suspend()
        fns[label] = fn
        nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
        ops[label] = sorted(n.op for n in nodes)
        print(f"  {label}: traced {fn.experimental_get_tracing_count()} time(s), {len(nodes)} ops")

    def block(fn, n):
        """Wall and process CPU seconds per step (CPU time is less hurt by a loaded box)."""
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            fn(it)
        return (time.perf_counter() - start) / n, (time.process_time() - cpu) / n

    for fn in fns.values():
        block(fn, a.steps)
    times: dict[str, list] = {label: [] for label in fns}
    labels = list(fns)
    for r in range(a.rounds):
        order = labels[r % len(labels):] + labels[:r % len(labels)]
        for label in order:
            times[label].append(block(fns[label], a.steps))
    base = statistics.median(w for w, _ in times[labels[0]])
    base_cpu = statistics.median(c for _, c in times[labels[0]])
    base_ops = ops[labels[0]]
    print(f"tiny step, {a.replicas} replicas, medians of {a.rounds} blocks x {a.steps} steps "
          f"(load {os.getloadavg()[0]:.2f})")
    for label in labels:
        t = statistics.median(w for w, _ in times[label])
        c = statistics.median(c for _, c in times[label])
        added = list(ops[label])
        for op in base_ops:
            if op in added:
                added.remove(op)
        kinds = {k: added.count(k) for k in sorted(set(added))}
        print(f"  {label:<22} wall {t * 1e3:7.3f} ms {(t - base) * 1e6:+7.1f} µs (x{t / base:6.4f})   "
              f"CPU {c * 1e3:7.3f} ms {(c - base_cpu) * 1e6:+7.1f} µs (x{c / base_cpu:6.4f})   "
              f"+{len(added)} ops {kinds if kinds else ''}")
    patches.resume()
    patches.restore()
    agent.stop()


if __name__ == "__main__":
    main()

"""What each in-graph probe adds to a tiny step, measured one probe at a time in one process.

The loop is bench/overhead.py's tiny step (MirroredStrategy over logical CPUs, ``next()`` inside
the step function). One step function is traced per variant, with the agent's patches active and
some probes disabled, so each graph carries only that variant's in-graph work; then the patches
are suspended and the variants' graphs are timed in rotating blocks (the Python side is not
measured here: bench/overhead.py does that). Each variant is traced ``--instances`` times, and
medians over instances are compared, beside each variant's spread over its traces (two traces of
one graph differ in speed by more than the probes cost: bench/_instances.py). Also prints the ops
each variant adds to the graph.

    python bench/ingraph_cost.py [--replicas 4] [--rounds 10] [--steps 60] [--instances 3] [--fit]

``--fit``: the step is Keras ``fit``'s own train function (steps_per_execution=1), rebuilt per
variant with ``make_train_function(force=True)`` and called directly on a distributed iterator.
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

import _instances  # noqa: E402
from _custom_loop import custom_loop  # noqa: E402

ALL = ("steps", "input_wait", "examples", "replica_loss")
VARIANTS = {
    "plain (no probes)": None,
    "step count only": ("input_wait", "examples", "replica_loss"),
    "+ input wait": ("examples", "replica_loss"),
    "+ examples": ("replica_loss",),
    "+ replica loss (all)": (),
}
# All probes, but a nested step function (Keras' one_step_on_data) is not made to start after the
# fetch is timed (fetch_order.gate): what that ordering costs (it is what makes fit's input wait true).
UNORDERED = "all, step not ordered"
VARIANTS[UNORDERED] = ()
# All probes, but the fetched batch is handed to the step as fetched, with no Identity waiting for
# the second timestamp (input_wait._after): what the gates cost (they are what keeps a custom
# loop's replicas from starting before the fetch is timed, so that its wait is read true).
UNGATED = "all, batch not gated"
VARIANTS[UNGATED] = ()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--instances", type=int, default=3,
                   help="traces of each variant (two traces of one graph differ in speed: bench/_instances.py)")
    p.add_argument("--fit", action="store_true", help="time Keras fit's train function (spe=1)")
    a = p.parse_args()

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
    from tpuwatch.agent import fetch_order, input_wait, probes

    ordered = fetch_order.gate
    gated = input_wait._after
    from tpuwatch.agent.runtime import Agent

    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(a.replicas)])
    agent = Agent(Path(tempfile.mkdtemp(prefix="tpuwatch-bench-")), "bench", sample_hz=4)
    patches = probes.install_all(agent, "bench", ["bench"], set())
    agent.start()
    patches.suspend()

    step, it = custom_loop(strategy, a.replicas, 8, hidden=1)

    if a.fit:
        import keras

        with strategy.scope():
            fit_model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(8, activation="relu"),
                                          keras.layers.Dense(1)])
            fit_model.compile(optimizer=keras.optimizers.SGD(0.001), loss="mse")

    def make_fn():
        if not a.fit:
            return tf.function(step)
        fit_model.make_train_function(force=True)
        return fit_model.train_function

    def traced_graph(fn):
        if not a.fit:
            return fn.get_concrete_function(it).graph
        # Keras wraps its tf.function in a plain Python function: the tf.function is a closure cell.
        inner = next(c.cell_contents for c in fn.__closure__ if hasattr(c.cell_contents, "get_concrete_function"))
        return inner.get_concrete_function(it).graph

    fns: dict[tuple[str, int], object] = {}
    ops = {}
    for instance in range(a.instances):  # several traces of each: see bench/_instances.py
        for label, disabled in VARIANTS.items():
            fn = make_fn()
            if disabled is not None:
                patches.resume()
                agent._disabled.clear()
                agent._disabled.update({name: "bench" for name in disabled})
            if label == UNORDERED:
                fetch_order.gate = lambda fetched, new_ops: None
            if label == UNGATED:
                input_wait._after = lambda result, t1, by_replica=None: result
            fn(it)
            fetch_order.gate = ordered
            input_wait._after = gated
            # The graph traced by that call (asked for while the same patches are active).
            graph_def = traced_graph(fn).as_graph_def()
            agent._disabled.clear()
            patches.suspend()
            fns[(label, instance)] = fn
            if instance == 0:
                nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
                ops[label] = sorted(n.op for n in nodes)

    def block(fn, n):
        """Wall and process CPU seconds per step (CPU time is less hurt by a loaded box)."""
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            fn(it)
        return (time.perf_counter() - start) / n, (time.process_time() - cpu) / n

    for fn in fns.values():
        block(fn, a.steps)
    wall: dict[tuple[str, int], list[float]] = {key: [] for key in fns}
    cpu: dict[tuple[str, int], list[float]] = {key: [] for key in fns}
    keys = list(fns)
    load0 = os.getloadavg()[0]
    for r in range(a.rounds):
        order = keys[r % len(keys):] + keys[:r % len(keys)]
        for key in order:
            w, c = block(fns[key], a.steps)
            wall[key].append(w)
            cpu[key].append(c)
    wall_med, cpu_med = _instances.medians(wall), _instances.medians(cpu)
    labels = list(VARIANTS)
    base = _instances.over_instances(wall_med, labels[0])
    base_cpu = _instances.over_instances(cpu_med, labels[0])
    base_ops = ops[labels[0]]
    kind = "fit spe=1" if a.fit else "custom loop"
    print(f"{kind} tiny step, {a.replicas} replicas, medians over {a.instances} traces of each variant of "
          f"{a.rounds} blocks x {a.steps} steps (load {load0:.2f}->{os.getloadavg()[0]:.2f})")
    for label in labels:
        t = _instances.over_instances(wall_med, label)
        c = _instances.over_instances(cpu_med, label)
        added = list(ops[label])
        for op in base_ops:
            if op in added:
                added.remove(op)
        kinds = {k: added.count(k) for k in sorted(set(added))}
        print(f"  {label:<22} wall {t * 1e3:7.3f} ms {(t - base) * 1e6:+7.1f} µs (x{t / base:6.4f}; traces spread "
              f"{_instances.spread(wall_med, label) * 1e6:5.0f} µs)   "
              f"CPU {c * 1e3:7.3f} ms {(c - base_cpu) * 1e6:+7.1f} µs   "
              f"+{len(added)} ops {kinds if kinds else ''}")
    patches.resume()
    patches.restore()
    agent.stop()


if __name__ == "__main__":
    main()

"""What the agent costs a training step: the same loop with and without it, interleaved call by call
in one process.

The loop is a MirroredStrategy custom loop over 4 logical CPU devices whose step function takes
the distributed iterator and calls ``next()`` inside (the in-graph input-wait, step-count and
per-replica-loss probes all run). Two step functions are traced: one with the agent's patches
installed (it carries the in-graph probes), one without. Calls are interleaved in a random order
each round, a few calls of each in a row: the instrumented function with the agent on, the plain one with the agent's step
probe switched off (its call wrapper returns at its first line), and the instrumented one with it
off (its in-graph probes alone). Each call is timed on its
own and the medians are compared: on a shared, noisy box a per-call median shrugs off the
preemptions that make block averages swing by more than the effect being measured. The agent's
thread (recording, sampling) runs throughout, and its CPU time is reported separately.

    python bench/overhead.py [--width 1024] [--rounds 150] [--big-rounds 8] [--run 8]

Prints the ratio (instrumented / plain median step time) and the added microseconds per step,
for a ~20 ms step (``--width``) and for a tiny step (where the fixed cost is easiest to see), and
the same for the middle 80% of calls (trimmed means).
"""

from __future__ import annotations

import argparse
import os
import random
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
    p.add_argument("--rounds", type=int, default=150, help="interleaved rounds of the tiny step (one call of each variant)")
    p.add_argument("--big-rounds", type=int, default=8, help="interleaved rounds of the ~20 ms step")
    p.add_argument("--run", type=int, default=8, help="calls of one variant in a row within a round")
    a = p.parse_args()

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
    from tpuwatch.agent import probes
    from tpuwatch.agent.runtime import Agent

    run_dir = Path(tempfile.mkdtemp(prefix="tpuwatch-bench-"))
    agent = Agent(run_dir, "bench", sample_hz=4)
    patches = probes.install_all(agent, "bench", ["bench"], set())
    agent.start()
    # Made with the agent installed, as in a script run by tpuwatch (it prepares its variables).
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(a.replicas)])
    agent_thread = next(t for t in __import__("threading").enumerate() if t.name == "tpuwatch-agent")

    for label, width, rounds in (("~20 ms step", a.width, a.big_rounds), ("tiny step", 8, a.rounds)):
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

        patches.suspend()
        plain = tf.function(step)
        plain(it)  # trace without the agent
        patches.resume()
        instrumented = tf.function(step)
        instrumented(it)  # trace with it: carries the in-graph probes

        perf = time.perf_counter

        disabled = agent._disabled

        def once(fn, active: bool) -> float:
            # Toggled by the agent's own switch, not by re-patching classes per call (putting
            # the wrappers back on every call cost ~0.7 ms a call by itself): with "steps" off,
            # the call wrapper returns at its first line.
            if not active:
                disabled["steps"] = "bench"
            start = perf()
            fn(it)
            elapsed = perf() - start
            disabled.pop("steps", None)
            return elapsed

        variants = {"agent": (instrumented, True), "plain": (plain, False), "graph": (instrumented, False)}
        for _ in range(20):  # warm up every variant
            for fn, active in variants.values():
                once(fn, active)
        # Steady state: the agent reads every record of a run's first 256 (see steps.READ_ALL_FIRST).
        agent.step_probe._read_all_left = 0
        times: dict[str, list[float]] = {name: [] for name in variants}
        proc = psutil.Process()
        cpu0 = _thread_cpu(proc, agent_thread.native_id)
        steps0 = agent.global_step
        names = list(variants)
        rng = random.Random(0)
        for _ in range(rounds):
            rng.shuffle(names)
            for name in names:
                # A few calls in a row: the agent's reads keep their real cadence (at most one
                # every 10 ms of training), which single interleaved calls would not.
                times[name].extend(once(*variants[name]) for _ in range(a.run))
        agent.flush()
        agent_cpu = _thread_cpu(proc, agent_thread.native_id) - cpu0
        recorded = agent.global_step - steps0
        med = {name: statistics.median(v) for name, v in times.items()}
        mid = {name: _trimmed_mean(v) for name, v in times.items()}
        print(f"{label:>12}: plain {med['plain'] * 1e3:8.3f} ms/step   with agent {med['agent'] * 1e3:8.3f} ms/step   "
              f"ratio {med['agent'] / med['plain']:6.4f}   added {(med['agent'] - med['plain']) * 1e6:+7.1f} µs/step   "
              f"(medians of {rounds} interleaved runs of {a.run} calls; load {os.getloadavg()[0]:.2f})")
        print(f"{'':>12}  of which in-graph probes {(med['graph'] - med['plain']) * 1e6:+7.1f} µs/step, "
              f"Python side {(med['agent'] - med['graph']) * 1e6:+7.1f} µs/step;   middle-80% means: ratio "
              f"{mid['agent'] / mid['plain']:6.4f}, added {(mid['agent'] - mid['plain']) * 1e6:+7.1f} µs/step;   "
              f"agent thread {agent_cpu / max(recorded, 1) * 1e6:6.1f} µs CPU/step ({recorded} steps recorded)")
    patches.resume()
    patches.restore()
    agent.stop()


def _trimmed_mean(values: list[float]) -> float:
    ordered = sorted(values)
    cut = len(ordered) // 10
    return statistics.fmean(ordered[cut:len(ordered) - cut])


def _thread_cpu(proc: psutil.Process, tid: int) -> float:
    for t in proc.threads():
        if t.id == tid:
            return t.user_time + t.system_time
    return 0.0


if __name__ == "__main__":
    main()

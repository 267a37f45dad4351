"""Where the agent's Python time per step goes: cProfile over a tiny-step MirroredStrategy custom
loop (4 logical CPUs, ``next()`` inside the step) with every probe installed.

    python bench/profile_agent.py [--steps 2000] [--top 25]

Prints the tpuwatch functions by own time per step (µs), and the load average. A profile inflates
small functions' times; read it for the ranking, and bench/overhead.py for the cost.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
    from tpuwatch.agent import probes
    from tpuwatch.agent.runtime import Agent

    agent = Agent(Path(tempfile.mkdtemp(prefix="tpuwatch-prof-")), "prof", sample_hz=4)
    patches = probes.install_all(agent, "prof", ["prof"], set())
    agent.start()
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(8), tf.keras.layers.Dense(1)])
        opt = tf.keras.optimizers.SGD(0.001)
    ds = tf.data.Dataset.from_tensor_slices((tf.random.normal([4096, 64]), tf.random.normal([4096, 1])))
    it = iter(strategy.experimental_distribute_dataset(ds.repeat().batch(256, drop_remainder=True).prefetch(2)))

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    @tf.function
    def step(iterator):
        x, y = next(iterator)
        return strategy.reduce("MEAN", strategy.run(replica_step, args=(x, y)), axis=None)

    for _ in range(50):
        step(it)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.steps):
        step(it)
    prof.disable()
    stats = pstats.Stats(prof)
    rows = [(tt, cc, func) for func, (cc, nc, tt, ct, callers) in stats.stats.items() if "tpuwatch" in func[0]]
    rows.sort(reverse=True)
    print(f"{a.steps} steps, load {os.getloadavg()[0]:.2f}; tpuwatch functions by own time per step:")
    for tt, calls, (path, line, name) in rows[: a.top]:
        print(f"  {tt / a.steps * 1e6:8.2f} µs  {calls / a.steps:6.2f} calls/step  {Path(path).name}:{line} {name}")
    total = sum(tt for tt, _, _ in rows)
    print(f"  {total / a.steps * 1e6:8.2f} µs  in all tpuwatch functions (own time)")
    patches.restore()
    agent.stop()


if __name__ == "__main__":
    main()

"""Where the agent's Python time per step goes: cProfile over a tiny-step MirroredStrategy custom
loop (4 logical CPUs, ``next()`` inside the step) with every probe installed.

    python bench/profile_agent.py [--steps 2000] [--top 25] [--agent-thread]

Prints the tpuwatch functions by own time per step (µs), and the load average: on the training
thread, or with ``--agent-thread`` on the agent's own thread (recording, sampling, the step taps),
per recorded step. A profile inflates small functions' times; read it for the ranking, and
bench/overhead.py for the cost.
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
    p.add_argument("--agent-thread", action="store_true", help="profile the agent's thread, not the training thread")
    a = p.parse_args()

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
    from tpuwatch.agent import probes
    from tpuwatch.agent.runtime import Agent

    agent = Agent(Path(tempfile.mkdtemp(prefix="tpuwatch-prof-")), "prof", sample_hz=4)
    patches = probes.install_all(agent, "prof", ["prof"], set())
    prof = cProfile.Profile()
    if a.agent_thread:
        loop = agent._loop

        def profiled_loop() -> None:
            prof.enable()  # cProfile follows the thread that enabled it
            try:
                loop()
            finally:
                prof.disable()

        agent._loop = profiled_loop  # type: ignore[method-assign]
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
    if a.agent_thread:
        agent.flush()
        prof.create_stats()
        before = dict(pstats.Stats(prof).stats)
    else:
        prof.enable()
    for _ in range(a.steps):
        step(it)
    if a.agent_thread:
        agent.flush()
        agent.stop()  # its loop returns: the profile is complete
    else:
        prof.disable()
    stats = pstats.Stats(prof)
    if a.agent_thread:  # the steps' share: what the warm-up's 50 steps cost taken out
        for func, (cc, nc, tt, ct, callers) in list(stats.stats.items()):
            b = before.get(func)
            if b:
                stats.stats[func] = (cc - b[0], nc - b[1], tt - b[2], ct - b[3], callers)
    rows = [(tt, cc, func) for func, (cc, nc, tt, ct, callers) in stats.stats.items() if "tpuwatch" in func[0]]
    rows.sort(reverse=True)
    where = "the agent's thread" if a.agent_thread else "the training thread"
    print(f"{a.steps} steps, load {os.getloadavg()[0]:.2f}; tpuwatch functions on {where} by own time per step:")
    for tt, calls, (path, line, name) in rows[: a.top]:
        print(f"  {tt / a.steps * 1e6:8.2f} µs  {calls / a.steps:6.2f} calls/step  {Path(path).name}:{line} {name}")
    total = sum(tt for tt, _, _ in rows)
    print(f"  {total / a.steps * 1e6:8.2f} µs  in all tpuwatch functions (own time)")
    patches.restore()
    if not a.agent_thread:
        agent.stop()


if __name__ == "__main__":
    main()

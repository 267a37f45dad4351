"""What the agent costs a Keras ``fit`` step: the same fit with and without it, alternating in one process.

Two identical models are compiled alike. One is first fitted with the agent's patches active, so
its train function is traced with the in-graph probes (per-replica loss, input wait, step count);
the other with the patches suspended, so it is plain. Blocks of ``fit(steps_per_epoch=N,
epochs=1)`` then alternate between them, the patches resumed for the instrumented model and
suspended for the plain one (as ``bench/overhead.py`` does for a custom loop). The agent's thread
(recording, sampling) runs throughout.

A block's time runs from the first ``on_train_batch_begin`` at or after ``--skip`` steps (so the
iterator's creation and the first steps of each fit are left out) to ``on_train_end`` (which waits
for the last step); per-step time is that over the steps in between. Both arms carry the same
timing callback.

Configurations: ``steps_per_execution=1`` under MirroredStrategy over 4 logical CPU devices, and
``steps_per_execution=K`` (``--spe``) under MirroredStrategy when it works there, else under the
default strategy (Keras 3.15 crashes with ``steps_per_execution > 1`` under MirroredStrategy,
keras-team/keras#19246). Each for a big step (``--width``) and a tiny step.

    python bench/fit_overhead.py [--width 1024] [--blocks 8] [--steps 48] [--spe 8] [--repeat 2]
                                 [--only spe1|spek] [--size big|tiny] [--calls 300] [--instances 3]

Prints, per configuration and repeat: plain and instrumented ms/step (medians over blocks), their
ratio and the median of the per-pair ratios (with their range), the added µs per step and the
1-minute load average. Then, per configuration, the same from ``--calls`` direct calls of the two
models' train functions interleaved call by call (as ``bench/overhead.py`` does; the agent adds
nothing per batch to fit's Python loop), which a noisy box disturbs far less than whole fits. For
those, ``--instances`` models of each arm are traced and medians over them compared: two traces
of one graph differ in speed by more than the probes cost (bench/_instances.py).
Asserts nothing.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _instances  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=1024,
                   help="hidden units of the big model (~20 ms a step on a quiet 2-core box, far more under load)")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--blocks", type=int, default=8, help="alternating block pairs")
    p.add_argument("--steps", type=int, default=48, help="steps per block (a multiple of --spe)")
    p.add_argument("--skip", type=int, default=8, help="steps at the start of each fit that are not timed")
    p.add_argument("--spe", type=int, default=8, help="steps_per_execution of the second configuration")
    p.add_argument("--repeat", type=int, default=2, help="A/B runs per configuration")
    p.add_argument("--only", choices=("spe1", "spek"), help="run one configuration")
    p.add_argument("--size", choices=("big", "tiny"), help="run one step size")
    p.add_argument("--instances", type=int, default=3,
                   help="models (traces) of each arm for --calls (two traces of one graph differ in speed: "
                        "bench/_instances.py)")
    p.add_argument("--calls", type=int, default=300,
                   help="interleaved direct calls of fit's train functions after the blocks (0: none)")
    a = p.parse_args()

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
    import keras

    from tpuwatch.agent import probes
    from tpuwatch.agent.runtime import Agent

    run_dir = Path(tempfile.mkdtemp(prefix="tpuwatch-fit-bench-"))
    agent = Agent(run_dir, "bench", sample_hz=4)
    patches = probes.install_all(agent, "bench", ["bench"], set())
    agent.start()
    active = [True]

    def agent_on(on: bool) -> None:  # suspend() twice in a row would forget the wrappers
        if on != active[0]:
            (patches.resume if on else patches.suspend)()
            active[0] = on

    agent_on(False)
    mirrored = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(a.replicas)])

    class BlockTimer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.t0: float | None = None
            self.step0 = 0
            self.t1 = 0.0

        def on_train_batch_begin(self, batch, logs=None):
            if self.t0 is None and batch >= a.skip:
                self.t0, self.step0 = time.perf_counter(), batch

        def on_train_end(self, logs=None):
            self.t1 = time.perf_counter()

    def make(strategy, width: int, spe: int):
        with strategy.scope():
            model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(width, activation="relu"),
                                      keras.layers.Dense(width, activation="relu"), keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.SGD(0.001), loss="mse", steps_per_execution=spe)
        return model

    def block(model, ds, steps: int) -> float:
        timer = BlockTimer()
        model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False, callbacks=[timer])
        assert timer.t0 is not None, "raise --steps above --skip"
        return (timer.t1 - timer.t0) / (steps - timer.step0)

    def ab(label: str, strategy, width: int, spe: int) -> None:
        x = tf.random.normal([4096, 64])
        y = tf.random.normal([4096, 1])
        batch = 64 * strategy.num_replicas_in_sync
        ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True).prefetch(2)
        # A block holds at least 16 executions: with steps_per_execution=8 a tiny step is ~0.5 ms.
        steps = max(a.steps, a.skip + 16 * spe)
        plain, instrumented = make(strategy, width, spe), make(strategy, width, spe)
        block(plain, ds, steps)  # traced without the agent
        agent_on(True)
        block(instrumented, ds, steps)  # traced with it: carries the in-graph probes
        agent_on(False)
        for run in range(a.repeat):
            for _ in range(2):  # warm up both
                block(plain, ds, steps)
                agent_on(True)
                block(instrumented, ds, steps)
                agent_on(False)
            load0 = os.getloadavg()[0]
            on, off = [], []
            steps0 = agent.global_step
            for i in range(a.blocks):
                for instrumented_phase in ((True, False) if i % 2 == 0 else (False, True)):
                    if instrumented_phase:
                        agent_on(True)
                        on.append(block(instrumented, ds, steps))
                        agent_on(False)
                    else:
                        off.append(block(plain, ds, steps))
            agent.flush()
            recorded = agent.global_step - steps0
            on_s, off_s = statistics.median(on), statistics.median(off)
            # Each pair ran back to back: the median of the pairs' ratios cancels slow drift of a
            # shared machine better than the ratio of the two medians.
            pairs = sorted(x / y for x, y in zip(on, off))
            print(f"{label:<38} run {run + 1}: plain {off_s * 1e3:8.3f} ms/step  with agent {on_s * 1e3:8.3f} "
                  f"ms/step  ratio {on_s / off_s:6.4f} (median of pair ratios {statistics.median(pairs):6.4f}, "
                  f"range {pairs[0]:.3f}-{pairs[-1]:.3f})  added {(on_s - off_s) * 1e6:+7.1f} µs/step  "
                  f"load {load0:.2f}->{os.getloadavg()[0]:.2f}  ({a.blocks} pairs x {steps} steps; "
                  f"{recorded} steps recorded, {a.blocks * steps} expected)", flush=True)
        if a.calls:
            plains, instrumenteds = [plain], [instrumented]
            for _ in range(a.instances - 1):  # more traces of each: see bench/_instances.py
                plains.append(make(strategy, width, spe))
                block(plains[-1], ds, steps)
                instrumenteds.append(make(strategy, width, spe))
                agent_on(True)
                block(instrumenteds[-1], ds, steps)
                agent_on(False)
            per_call(label, strategy, plains, instrumenteds, ds, spe)

    kept_iterators: list = []

    def per_call(label: str, strategy, plains, instrumenteds, ds, spe: int) -> None:
        """Fit's own train functions, called directly and interleaved call by call (the agent
        adds nothing per batch to fit's Python loop: its Keras hooks are per epoch)."""
        variants = {}
        for i, (plain, instrumented) in enumerate(zip(plains, instrumenteds)):
            variants[("agent", i)] = (instrumented.train_function, True)
            variants[("plain", i)] = (plain.train_function, False)
            variants[("graph", i)] = (instrumented.train_function, False)
        its = {key: iter(strategy.experimental_distribute_dataset(ds)) for key in variants}
        # Never destroyed: TF's multi-device iterator over a repeated, prefetched dataset can block
        # in its destructor for minutes (seen here, tf.data threads idle); the process ends with
        # os._exit instead.
        kept_iterators.append(its)

        disabled = agent._disabled

        def once(key: tuple[str, int]) -> float:
            # The agent's own switch, not re-patching per call (that alone cost ~0.7 ms a call):
            # with "steps" off the call wrapper returns at its first line.
            fn, on = variants[key]
            if not on:
                disabled["steps"] = "bench"
            start = time.perf_counter()
            fn(its[key])
            elapsed = time.perf_counter() - start
            disabled.pop("steps", None)
            return elapsed / spe

        agent_on(True)
        keys = list(variants)
        for _ in range(10):
            for key in keys:
                once(key)
        agent.step_probe.pacer.read_all_left = 0  # steady state (the first 256 records are all read)
        rng = random.Random(0)
        times: dict[tuple[str, int], list[float]] = {key: [] for key in keys}
        load0 = os.getloadavg()[0]
        for _ in range(max(1, a.calls // 8)):
            rng.shuffle(keys)
            for key in keys:  # a few calls in a row keep the agent's read cadence real
                times[key].extend(once(key) for _ in range(8))
        agent_on(False)
        med = _instances.medians(times)
        plain_s, agent_s, graph_s = (_instances.over_instances(med, v) for v in ("plain", "agent", "graph"))
        print(f"{label:<38} per call: plain {plain_s * 1e3:8.3f} ms/step  with agent {agent_s * 1e3:8.3f} "
              f"ms/step  ratio {agent_s / plain_s:6.4f}  added {(agent_s - plain_s) * 1e6:+7.1f} µs/step "
              f"(in-graph {(graph_s - plain_s) * 1e6:+7.1f}, plain traces spread "
              f"{_instances.spread(med, 'plain') * 1e6:.1f}; Python {_instances.paired(med, 'agent', 'graph') * 1e6:+7.1f}, "
              f"same trace)  load {load0:.2f}->{os.getloadavg()[0]:.2f}  (medians over {len(plains)} traces of each, "
              f"{a.calls} calls each, interleaved 8 at a time)", flush=True)

    configs = []
    if a.only in (None, "spe1"):
        configs.append(("spe1", mirrored, 1))
    if a.only in (None, "spek"):
        configs.append(("spek", mirrored, a.spe))
    for _name, strategy, spe in configs:
        sizes = {"big": (f"width {a.width}", a.width), "tiny": ("tiny step", 8)}
        for size, width in [sizes[a.size]] if a.size else sizes.values():
            kind = "default strategy" if strategy is tf.distribute.get_strategy() else type(strategy).__name__
            try:
                ab(f"fit spe={spe} {kind} {size}", strategy, width, spe)
            except Exception as e:  # keras-team/keras#19246: spe > 1 under MirroredStrategy
                if strategy is tf.distribute.get_strategy():
                    raise
                agent_on(False)
                print(f"fit spe={spe} under {kind} failed ({type(e).__name__}: {str(e).splitlines()[0][:100]}); "
                      "using the default strategy", flush=True)
                strategy = tf.distribute.get_strategy()
                ab(f"fit spe={spe} default strategy {size}", strategy, width, spe)
    agent_on(True)
    patches.restore()
    agent.stop()
    sys.stdout.flush()
    os._exit(0)  # see kept_iterators


if __name__ == "__main__":
    main()

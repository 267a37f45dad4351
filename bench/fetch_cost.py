"""What the fetch of a batch costs a step, in plain TensorFlow (no tpuwatch): the step given a
batch it already has, the step calling ``next(iterator)`` inside its ``tf.function``, and the step
given ``next(iterator)`` eagerly between calls. The two last less the first are what the fetch
adds; their ratio is the most that moving the fetch into the step (the ``input-bound`` finding's
advice for a Python loop over a dataset) can save. That edit cut the planted
``input_eager_fetch.py`` wait 0.33-0.61x, not always by half.

``--replicas N``: a MirroredStrategy over N logical CPUs and ``experimental_distribute_dataset``
(0: no strategy, a plain dataset). ``--cached``: the batches come from an in-memory cache, so the
fetch is the hand-over alone, not the pipeline's work. Run:
``python bench/fetch_cost.py --replicas 2`` (each configuration in its own process).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--cached", action="store_true")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()

    import keras
    import numpy as np
    import tensorflow as tf

    if args.replicas:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)
        strategy = tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
    else:
        strategy = tf.distribute.get_strategy()
    rng = np.random.default_rng(0)
    n = 64 * args.batch
    x = rng.random((n, 32), dtype=np.float32)
    y = (x.sum(axis=1) > 16).astype(np.int64)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=0).batch(args.batch, drop_remainder=True)
    ds = (ds.take(32).cache() if args.cached else ds).repeat().prefetch(tf.data.AUTOTUNE)
    data = strategy.experimental_distribute_dataset(ds) if args.replicas else ds
    with strategy.scope():
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(args.hidden, activation="relu"),
                                  keras.layers.Dense(args.hidden, activation="relu"), keras.layers.Dense(2)])
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
        loss_of = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def replica_step(features, labels):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_of(labels, model(features, training=True)),
                                              global_batch_size=args.batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def one(batch):
        return strategy.reduce("SUM", strategy.run(replica_step, args=batch), axis=None)

    given = tf.function(one)
    fetching = tf.function(lambda it: one(next(it)))
    iterator = iter(data)
    batch = next(iterator)
    ways = {"no fetch": lambda: float(given(batch)), "in the step": lambda: float(fetching(iterator)),
            "eager": lambda: float(given(next(iterator)))}

    def ms_per_step(call) -> float:
        start = time.perf_counter()
        for _ in range(args.steps):
            call()
        return (time.perf_counter() - start) / args.steps * 1000

    for call in ways.values():  # traced and warm
        for _ in range(30):
            call()
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):  # interleaved rounds: the box's load drifts alike for all three
        for name, call in ways.items():
            times[name].append(ms_per_step(call))
    med = {name: statistics.median(v) for name, v in times.items()}
    inside, eager = med["in the step"] - med["no fetch"], med["eager"] - med["no fetch"]
    print(f"replicas={args.replicas} hidden={args.hidden} batch={args.batch} cached={args.cached} "
          f"load {os.getloadavg()[0]:.2f}: step {med['no fetch']:.3f} ms without a fetch; the fetch adds "
          f"{inside:.3f} ms in the step, {eager:.3f} ms eagerly; in-step/eager {inside / eager:.2f}x"
          if eager > 0 else f"eager fetch cost not measurable: {med}")


if __name__ == "__main__":
    main()

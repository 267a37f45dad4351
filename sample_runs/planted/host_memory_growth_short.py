"""Planted problem (short run): host memory grows ~2 MiB every step. Rule: host-memory-growth.

The loop keeps a copy of each step's inputs "for a plot at the end": RSS grows by --mib-per-step
(default 2) every step, 400 steps (--steps) paced to --steps-per-second (default 80, so the
agent's 2 Hz host samples see the climb): ~800 MiB in 5 s. At that pace host memory would run out
within minutes: the finding is critical.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import numpy as np
import tensorflow as tf
import keras
from training_setup import make_strategy, synthetic_mnist


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--mib-per-step", type=float, default=2.0)
    p.add_argument("--steps-per-second", type=float, default=80.0)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--batch-per-replica", type=int, default=8)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    strategy = make_strategy(args.replicas)
    global_batch = args.batch_per_replica * strategy.num_replicas_in_sync

    images, labels = synthetic_mnist(1024, seed=0)
    ds = (tf.data.Dataset.from_tensor_slices((images, labels)).cache().repeat()
          .batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
    iterator = iter(strategy.experimental_distribute_dataset(ds))
    with strategy.scope():
        model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            per_example = loss_object(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.reduce_mean(per_example)

    @tf.function
    def train_step(iterator):
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(step_fn, args=next(iterator)), axis=None)

    kept: list[np.ndarray] = []  # planted: one array per step, never cleared
    floats = int(args.mib_per_step * 2**20 / 4)
    period_s = 1.0 / args.steps_per_second
    for step in range(1, args.steps + 1):
        t0 = time.monotonic()
        loss = float(train_step(iterator))
        kept.append(np.full(floats, loss, dtype=np.float32))  # filled: the pages are really used
        if step % 100 == 0:
            print(f"step {step}  loss {loss:.4f}  kept {len(kept) * args.mib_per_step:.0f} MiB", flush=True)
        time.sleep(max(0.0, period_s - (time.monotonic() - t0)))
    print(f"done: {args.steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

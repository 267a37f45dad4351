"""Planted problem: a custom loop fetches each distributed batch eagerly. Rule: input-bound,
naming the ``for batch in dist_ds`` line.

``MirroredStrategy`` over two logical CPUs, a pipeline that already overlaps (batch, prefetch) and
a small model: ``for batch in dist_ds`` around ``train_step(batch)`` builds each per-replica batch in Python
between the compiled steps (~3 ms on the 2-core box), a large part of a short step. The fix
fetches inside the step: ``train_step(iterator)`` calling ``next(iterator)`` in the
``tf.function``.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import keras
import numpy as np
import tensorflow as tf


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--examples", type=int, default=6400)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
    global_batch = 64
    steps_per_epoch = args.examples // global_batch

    rng = np.random.default_rng(0)
    x = rng.random((args.examples, 32), dtype=np.float32)
    y = (x.sum(axis=1) > 16).astype(np.int64)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(args.examples, seed=0)
    ds = ds.batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    dist_ds = strategy.experimental_distribute_dataset(ds)

    with strategy.scope():
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(2)])
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def step_fn(features, labels):
        with tf.GradientTape() as tape:
            per_example = loss_object(labels, model(features, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(batch):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=batch), axis=None)

    for epoch in range(args.epochs):
        total = 0.0
        for batch in dist_ds:
            total += float(train_step(batch))
        print(f"epoch {epoch}: loss {total / steps_per_epoch:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

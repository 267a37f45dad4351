"""Planted problem (short run): one replica's slice of every batch is corrupted from batch 20, and
the loss goes non-finite right after. Rules: replica-loss-skew (the origin) and loss-nonfinite.

experimental_distribute_dataset splits each global batch in order, so rows [r*b, (r+1)*b) go to
replica r. From batch --corrupt-from (default 20) the pipeline multiplies replica --bad-replica's
rows (default 3) by --scale (default 1e20: garbage where the pixels should be, as from a shard
written with the wrong dtype) and shifts their labels by one (another label map). That replica's
loss jumps about 10^20x above the others'; plain SGD carries its huge gradients into every
replica's weights and the loss overflows on the next step. --steps (default 40).
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
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--corrupt-from", type=int, default=20)
    p.add_argument("--bad-replica", type=int, default=3)
    p.add_argument("--scale", type=float, default=1e20)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--batch-per-replica", type=int, default=16)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    strategy = make_strategy(args.replicas)
    b = args.batch_per_replica
    global_batch = b * strategy.num_replicas_in_sync
    rows = np.arange(global_batch)
    bad_rows = tf.constant(((rows >= args.bad_replica * b) & (rows < (args.bad_replica + 1) * b))
                           .astype(np.float32).reshape(-1, 1, 1, 1))

    def corrupt(index, batch):
        x, y = batch
        scale = tf.where(index + 1 >= args.corrupt_from, args.scale, 1.0)  # batch numbers start at 1
        bad = index + 1 >= args.corrupt_from
        labels = tf.where(bad & (tf.reshape(bad_rows, [-1]) > 0), (y + 1) % 10, y)
        return x * (1.0 + (scale - 1.0) * bad_rows), labels

    images, labels = synthetic_mnist(2048, seed=0)
    ds = (tf.data.Dataset.from_tensor_slices((images, labels)).repeat()
          .batch(global_batch, drop_remainder=True).enumerate().map(corrupt).prefetch(2))
    iterator = iter(strategy.experimental_distribute_dataset(ds))
    with strategy.scope():
        model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
        optimizer = keras.optimizers.SGD(0.1)
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

    for step in range(1, args.steps + 1):
        loss = float(train_step(iterator))
        print(f"step {step}  loss {loss:.4g}", flush=True)
    print(f"done: {args.steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

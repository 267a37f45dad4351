"""Planted problem: the loss turns NaN after some steps. Rule that should fire: loss-nonfinite.

Each image is standardised by hand, ``(x - mean) / std``, with no epsilon. The data holds one
blank (constant) image -- a corrupt record -- in batch number ``--nan-at-step`` (default 12), in
the slice that replica 1 trains on. Its 0/0 makes that replica's loss NaN at that step; the NaN
gradients are summed into every replica's weights, so from the next step on every replica's loss
is NaN. The script keeps training (as unattended jobs do) for ``--steps`` (default 20) and exits 0.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import tensorflow as tf
import keras
from training_setup import make_strategy, synthetic_mnist


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--nan-at-step", type=int, default=12)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--batch-per-replica", type=int, default=32)
    args = p.parse_args()
    if not 1 <= args.nan_at_step <= args.steps:
        p.error("--nan-at-step must be between 1 and --steps")
    keras.utils.set_random_seed(0)  # Python, NumPy and TF seeds: weights start the same every run
    tf.random.set_seed(0)
    strategy = make_strategy(args.replicas)
    replicas = strategy.num_replicas_in_sync
    global_batch = args.batch_per_replica * replicas

    images, labels = synthetic_mnist(args.steps * global_batch, seed=0)
    # Planted: a blank image, at the start of replica 1's slice of batch --nan-at-step.
    blank = (args.nan_at_step - 1) * global_batch + min(1, replicas - 1) * args.batch_per_replica
    images[blank] = 0.5

    def standardize(x, y):
        mean, variance = tf.nn.moments(x, axes=[0, 1, 2])
        return (x - mean) / tf.sqrt(variance), y  # no epsilon: a blank image gives 0/0

    ds = (tf.data.Dataset.from_tensor_slices((images, labels))  # already in random order: no shuffle
          .map(standardize, num_parallel_calls=tf.data.AUTOTUNE)
          .batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
    dist_ds = strategy.experimental_distribute_dataset(ds)

    with strategy.scope():
        model = keras.Sequential([
            keras.Input((28, 28, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="tanh"),  # (relu would map NaN to 0 on oneDNN CPUs)
            keras.layers.Dense(10),
        ])
        optimizer = keras.optimizers.Adam(1e-3)
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
    def train_step(batch):
        per_replica_loss = strategy.run(step_fn, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica_loss, axis=None)

    for step, batch in enumerate(dist_ds, start=1):
        loss = float(train_step(batch))
        print(f"step {step}  loss {loss:.4f}", flush=True)
    print(f"done: {args.steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

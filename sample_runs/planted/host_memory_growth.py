"""Planted problem: host memory that grows every step. Rule that should fire: host-memory-growth.

The loop keeps each step's embeddings as NumPy arrays in a list "for a plot at the end" -- a slow
leak: process RSS grows by about ``--mb-per-step`` MB (default 0.1) every step, steadily, for
``--minutes`` (default 3.5) of training, then the script prints how much it kept and exits.
Steps are paced to at most ``--steps-per-second`` (default 10) so the slope is about the same on a
fast machine: ~1 MB/s (60 MB/min), ~200 MB over the default run. The rule ignores the first
minute and wants a trend over 2 minutes more, hence 3.5 minutes.
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
    p.add_argument("--minutes", type=float, default=3.5)
    p.add_argument("--mb-per-step", type=float, default=0.1)
    p.add_argument("--steps-per-second", type=float, default=10.0)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--batch-per-replica", type=int, default=32)
    args = p.parse_args()
    keras.utils.set_random_seed(0)  # Python, NumPy and TF seeds: weights start the same every run
    tf.random.set_seed(0)
    strategy = make_strategy(args.replicas)
    global_batch = args.batch_per_replica * strategy.num_replicas_in_sync
    # Embedding width such that one step's float32 embeddings take --mb-per-step MB.
    width = max(1, round(args.mb_per_step * 2**20 / 4 / global_batch))

    images, labels = synthetic_mnist(4096, seed=0)
    ds = (tf.data.Dataset.from_tensor_slices((images, labels)).cache().shuffle(4096, seed=0).repeat()
          .batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
    dist_ds = strategy.experimental_distribute_dataset(ds)

    with strategy.scope():
        inputs = keras.Input((28, 28, 1))
        embedding = keras.layers.Dense(width, activation="relu")(keras.layers.Flatten()(inputs))
        logits = keras.layers.Dense(10)(embedding)
        model = keras.Model(inputs, [logits, embedding])
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            logits, embedding = model(x, training=True)
            per_example = loss_object(y, logits)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.reduce_mean(per_example), embedding

    @tf.function
    def train_step(batch):
        per_replica_loss, per_replica_embedding = strategy.run(step_fn, args=batch)
        loss = strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica_loss, axis=None)
        return loss, strategy.gather(per_replica_embedding, axis=0)

    kept: list[np.ndarray] = []  # planted: grows by one array per step, never cleared
    deadline = None  # set after the first step: --minutes of training, not of tracing
    period_s = 1.0 / args.steps_per_second
    step = 0
    for batch in dist_ds:
        t0 = time.monotonic()
        loss, embedding = train_step(batch)
        kept.append(embedding.numpy())
        step += 1
        if deadline is None:
            deadline = time.monotonic() + 60.0 * args.minutes
        if step % 50 == 0:
            mb = sum(a.nbytes for a in kept) / 2**20
            print(f"step {step}  loss {float(loss):.4f}  kept {mb:.0f} MB of embeddings", flush=True)
        if time.monotonic() >= deadline:
            break
        time.sleep(max(0.0, period_s - (time.monotonic() - t0)))
    print(f"done: {step} steps, kept {sum(a.nbytes for a in kept) / 2**20:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Healthy custom loop that caches its decoded images in memory: nothing planted, no alarm.

Decodes once (uint8 -> float32 in ``.map``), ``.cache()``s the decoded images (in memory, or to
``--cache-file``), shuffles, batches and prefetches, as the tf.data and distributed-training guides
recommend; ``--epochs`` (default 3) passes of ``for batch in dist_dataset``. RSS rises during the
first pass while the cache fills (~``--images`` x 12 KiB) and stays flat after: that is the cache
doing its job, not a leak.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import numpy as np
import tensorflow as tf
import keras
from training_setup import make_strategy


def decode(image, label):
    return tf.cast(image, tf.float32) / 255.0, label


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--images", type=int, default=8192)
    p.add_argument("--cache-file", default="", help="cache to this file instead of memory")
    p.add_argument("--shuffle-buffer", type=int, default=1024)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--batch-per-replica", type=int, default=16)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    strategy = make_strategy(args.replicas)
    global_batch = args.batch_per_replica * strategy.num_replicas_in_sync

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (args.images, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, args.images).astype(np.int64)
    ds = (tf.data.Dataset.from_tensor_slices((images, labels))
          .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
          .cache(args.cache_file)
          .shuffle(args.shuffle_buffer, seed=0)
          .batch(global_batch, drop_remainder=True)
          .prefetch(tf.data.AUTOTUNE))
    dist_ds = strategy.experimental_distribute_dataset(ds)

    with strategy.scope():
        model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(8, 3, activation="relu"),
                                  keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            per_example = loss_object(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(batch):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=batch), axis=None)

    step = 0
    for epoch in range(args.epochs):
        total = 0.0
        batches = 0
        for batch in dist_ds:
            total += float(train_step(batch))
            batches += 1
            step += 1
        print(f"epoch {epoch}  steps {step}  loss {total / batches:.4f}", flush=True)
    print(f"done: {step} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

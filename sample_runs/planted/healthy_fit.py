"""Healthy Keras ``model.fit``: nothing planted. No diagnostics rule should fire.

MirroredStrategy over ``--replicas`` logical CPU devices (TPUStrategy when a TPU resolves), a cached,
shuffled, batched (static shapes) and prefetched tf.data pipeline, a small convnet compiled once.
Runs ``--epochs`` x ``--steps-per-epoch`` steps (default 3 x 10).
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
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=10)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--batch-per-replica", type=int, default=32)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    tf.random.set_seed(0)
    strategy = make_strategy(args.replicas)
    global_batch = args.batch_per_replica * strategy.num_replicas_in_sync

    images, labels = synthetic_mnist(4096, seed=0)
    ds = (tf.data.Dataset.from_tensor_slices((images, labels)).cache().shuffle(4096, seed=0).repeat()
          .batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE))

    with strategy.scope():
        model = keras.Sequential([
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["sparse_categorical_accuracy"])
    model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=2)
    print(f"done: {args.epochs * args.steps_per_epoch} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

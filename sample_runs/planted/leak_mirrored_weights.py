"""Planted problem: under MirroredStrategy (2 replicas) a callback keeps a NumPy copy of the
weights after every batch. Rule: host-memory-growth, naming the callback's line.

A ``fit`` over 5 short epochs on two replicas whose callback saves ``model.get_weights()`` after
each batch "to average the last few later": ~0.5 MiB of NumPy arrays a step, never dropped. Five
epochs (~6 s of training on a quiet 2-core box): the host-memory rule leaves the first epoch out
(a cache may fill in it) and wants 6 host samples at 2 Hz after it; three epochs gave 5-6.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import keras
import numpy as np
import tensorflow as tf

from training_setup import make_strategy


class KeepWeights(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(self.model.get_weights())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--steps-per-epoch", type=int, default=150)
    args = p.parse_args()
    strategy = make_strategy(2)
    rng = np.random.default_rng(0)
    x = rng.random((4096, 128), dtype=np.float32)
    y = rng.integers(0, 10, 4096)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(4096).repeat().batch(256).prefetch(tf.data.AUTOTUNE)
    with strategy.scope():
        model = keras.Sequential([keras.Input((128,)), keras.layers.Dense(1024, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    keeper = KeepWeights()
    model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, callbacks=[keeper], verbose=2)
    print(f"kept {len(keeper.seen)} copies of the weights")
    return 0


if __name__ == "__main__":
    sys.exit(main())

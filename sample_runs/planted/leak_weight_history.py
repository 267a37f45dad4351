"""Planted problem: a callback keeps a copy of the weights after every batch. Rule:
host-memory-growth, naming the callback's line.

A Keras ``fit`` with a callback that records ``model.get_weights()`` at each batch end "to plot
how the weights move": ~0.25 MiB of NumPy arrays per step, never dropped.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import keras
import numpy as np
import tensorflow as tf


class WeightHistory(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.snapshots: list[list[np.ndarray]] = []

    def on_train_batch_end(self, batch, logs=None):
        self.snapshots.append(self.model.get_weights())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps-per-epoch", type=int, default=1200)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.random((8192, 64), dtype=np.float32)
    y = rng.integers(0, 10, 8192)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(8192).repeat().batch(1024).prefetch(tf.data.AUTOTUNE)

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1024, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = WeightHistory()
    model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, callbacks=[history], verbose=2)
    print(f"kept {len(history.snapshots)} weight snapshots")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Planted problem: a Keras callback reads all the weights back after every batch. Rule:
host-bound, naming the callback's line.

A ``fit`` with a callback that tracks how far the weights have moved from where they started
"to see when training settles": after each batch it copies every weight to NumPy
(``get_weights()``) and takes the distance, between two steps, on the training thread. The fix
does it every N batches (or once per epoch).
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import keras
import numpy as np
import tensorflow as tf


class WeightDrift(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.start = self.model.get_weights()
        self.drift: list[float] = []

    def on_train_batch_end(self, batch, logs=None):
        weights = self.model.get_weights()
        self.drift.append(float(np.sqrt(sum(np.sum((w - w0) ** 2) for w, w0 in zip(weights, self.start)))))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps-per-epoch", type=int, default=300)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.random((4096, 256), dtype=np.float32)
    y = rng.integers(0, 10, 4096)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(4096).repeat().batch(64).prefetch(tf.data.AUTOTUNE)

    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1024, activation="relu"),
                              keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    drift = WeightDrift()
    model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, callbacks=[drift], verbose=2)
    print(f"weights moved {drift.drift[-1]:.3f} from the start over {len(drift.drift)} batches")
    return 0


if __name__ == "__main__":
    sys.exit(main())

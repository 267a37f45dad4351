"""Planted case: NumPy arrays straight into ``model.fit``, with slow per-batch Python in a
callback. Rule: none wrongly; if ``input-bound`` fires it must say there is no tf.data pipeline of
the script's and never advise a ``.prefetch`` the script cannot add to.

Keras turns the arrays into its own tf.data pipeline (it slices, batches and prefetches them); the
slow part here is the script's own ``on_train_batch_end`` (~5 ms of Python bookkeeping a batch),
which is host time between steps, not input.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import keras
import numpy as np


class BatchLog(keras.callbacks.Callback):
    """Keeps every batch's loss, as scripts that plot their own curves do."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))
        time.sleep(0.005)  # stands for appending the line to a CSV on a slow network disk


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--examples", type=int, default=4096)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.random((args.examples, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, args.examples)

    model = keras.Sequential([
        keras.Input((28, 28)),
        keras.layers.Flatten(),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    log = BatchLog()
    model.fit(x, y, batch_size=64, epochs=args.epochs, callbacks=[log], verbose=2)
    print(f"{len(log.losses)} batch losses kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Planted problem: a tf.numpy_function in the input pipeline memoises every batch it sees in a
dict. Rule: host-memory-growth, naming the memo's line.

A ``fit`` whose pipeline standardises each batch in NumPy through ``tf.numpy_function`` and keeps
every result "to look at later": 1.5 MiB a step on tf.data's threads, ~1 GB in 700 steps. The
model's 256-unit layer makes a step ~6 ms (4-5 s of training on a quiet 2-core box): with a 64-unit
one a fast day's run trained for 2 s, 4 host samples at 2 Hz, fewer than the host-memory rule's 6.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import keras
import numpy as np
import tensorflow as tf

seen = {}


def normalise(batch):
    out = (batch - batch.mean()) / (batch.std() + 1e-6)
    seen[len(seen)] = out
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=700)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    x = rng.random((8192, 384), dtype=np.float32)
    y = rng.integers(0, 10, 8192)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(1024)
    ds = ds.map(lambda xb, yb: (tf.numpy_function(normalise, [xb], tf.float32), yb))
    ds = ds.map(lambda xb, yb: (tf.ensure_shape(xb, (None, 384)), yb)).prefetch(tf.data.AUTOTUNE)
    model = keras.Sequential([keras.Input((384,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, epochs=1, steps_per_epoch=args.steps, verbose=2)
    print(f"memoised {len(seen)} batches")
    return 0


if __name__ == "__main__":
    sys.exit(main())

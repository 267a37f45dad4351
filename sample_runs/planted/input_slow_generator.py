"""Planted problem: a slow Python generator feeds the training. Rule: input-bound, naming the
``from_generator`` line.

A Keras ``fit`` on ``tf.data.Dataset.from_generator`` over a generator that builds each example
in Python (~1 ms: a stand-in for reading and augmenting a record with PIL), one at a time under
the GIL; batching and prefetch cannot make the generator faster than that.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import keras
import numpy as np
import tensorflow as tf


def examples():
    rng = np.random.default_rng(0)
    while True:
        time.sleep(0.001)  # reading and augmenting one record in Python
        x = rng.random(32, dtype=np.float32)
        yield x, int(x.sum() > 16)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    ds = tf.data.Dataset.from_generator(
        examples, output_signature=(tf.TensorSpec((32,), tf.float32), tf.TensorSpec((), tf.int64)))
    ds = ds.batch(32).prefetch(tf.data.AUTOTUNE)

    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, epochs=1, steps_per_epoch=args.steps, verbose=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

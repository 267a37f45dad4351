"""Planted problem: a map that decodes in Python, one element at a time. Rule: input-bound.

A Keras ``fit`` on a tf.data pipeline whose ``.map(decode)`` runs a decode in Python through
``tf.numpy_function`` (most of it waiting, as a read of each image from a store does) without
``num_parallel_calls``: every batch waits for 32 decodes in a row, about 1.6 times the step. The
pipeline already ends with ``prefetch``; the fix is the map's
``num_parallel_calls=tf.data.AUTOTUNE``.

The decode's wait is sized to this machine (``fit``'s first steps timed with the wait off, by a
callback), because the fix's effect depends on it: where AUTOTUNE has two cores, two decodes at a
time take ~0.8 of the step, and the prefetch buffer hides them. (At twice the step, two decodes at
a time took the whole step: what was left of the wait, 6-29 %, was the box's noise. Sized from an
eager pass timed before training, the decodes came to twice the step where the compiled step was
0.6x the eager pass, not the 0.75x assumed: 52 % -> 29 % in CI.) Measured (2026-11-30, load
0.8-2.0, TF 2.21 and 2.16, two of them beside a busy process): 40, 41, 43, 40, 43, 41, 40 % ->
none, none, 13 %, none, none, none, none. With a fixed wait the same script was 45 % input-bound
on one day's 2-core box and under 10 % on a slower day's.
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
from training_setup import SizeByFirstSteps

READ_WAIT_S = 0.0  # set from fit's first steps (SizeByFirstSteps)


def decode_bytes(raw: np.ndarray) -> np.ndarray:
    if READ_WAIT_S:
        time.sleep(READ_WAIT_S)  # stands for the wait of reading the image
    return (raw.astype(np.float32) / 255.0).reshape(32, 32, 3)


def decode(raw, label):
    image = tf.numpy_function(decode_bytes, [raw], tf.float32)
    image.set_shape((32, 32, 3))
    return image, label


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps-per-epoch", type=int, default=60)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (4096, 32 * 32 * 3), dtype=np.uint8)
    labels = rng.integers(0, 10, 4096)

    model = keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def size(step_s: float) -> None:
        global READ_WAIT_S
        READ_WAIT_S = max(0.0005, 1.6 * step_s / 32 - 0.0005)  # a batch's decodes: ~1.6 steps


    ds = tf.data.Dataset.from_tensor_slices((raw, labels))
    ds = ds.shuffle(4096).repeat()
    ds = ds.map(decode)
    ds = ds.batch(32)
    ds = ds.prefetch(2)

    model.compile(optimizer="adam", loss=loss)
    model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=2,
              callbacks=[SizeByFirstSteps(size)])
    return 0


if __name__ == "__main__":
    sys.exit(main())

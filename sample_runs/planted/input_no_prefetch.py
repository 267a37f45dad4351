"""Planted problem: no ``prefetch`` at the end, and options that turn off the one TensorFlow would
add. Rule: input-bound, naming the ``batch`` line and the prefetch to add after it.

The script gives tf.data fixed resources (``options.autotune.enabled = False``, a parallel map
with 8 calls) to keep it off the cores the model uses, as tuning guides for shared hosts
suggest. With autotune off TensorFlow no longer puts a ``prefetch`` after the last stage, so the
``batch``, fed by a shuffle buffer that the parallel map refills, is assembled only when the
Keras ``fit`` step asks for it: each image waits ~0.5 ms of I/O latency before it decodes. The
fix ends the pipeline with ``.prefetch(tf.data.AUTOTUNE)``, which makes the next batch during the
step.
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

SIZE = 64


def read_image(raw: np.ndarray) -> np.ndarray:
    time.sleep(0.0005)  # the storage's latency before the bytes arrive
    return (raw.astype(np.float32) / 255.0).reshape(SIZE, SIZE, 3)


def decode(raw, label):
    image = tf.numpy_function(read_image, [raw], tf.float32)
    image.set_shape((SIZE, SIZE, 3))
    return image, label


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps-per-epoch", type=int, default=60)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (2048, SIZE * SIZE * 3), dtype=np.uint8)
    labels = rng.integers(0, 10, 2048)

    options = tf.data.Options()
    options.autotune.enabled = False  # fixed resources for tf.data on a shared host
    ds = tf.data.Dataset.from_tensor_slices((raw, labels)).repeat()
    ds = ds.map(decode, num_parallel_calls=8)
    ds = ds.shuffle(256)
    ds = ds.batch(64)
    ds = ds.with_options(options)

    model = keras.Sequential([
        keras.Input((SIZE, SIZE, 3)),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

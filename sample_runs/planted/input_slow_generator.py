"""Planted problem: a Python generator augments each image itself. Rule: input-bound, naming the
``from_generator`` line.

A Keras ``fit`` on ``tf.data.Dataset.from_generator`` over a generator that, for every image,
converts it to float, crops a random window, flips it and standardises it in NumPy before
yielding it: one image at a time, under the GIL, so batching and prefetch cannot make it faster.
The fix moves that work into ``.map(augment, num_parallel_calls=tf.data.AUTOTUNE)`` on tensors
(TF ops, which run in parallel and release the GIL); the generator then yields the raw images.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import keras
import numpy as np
import tensorflow as tf

SIZE, CROP = 160, 128
rng = np.random.default_rng(0)
images = rng.integers(0, 256, (256, SIZE, SIZE, 3), dtype=np.uint8)  # stands for decoded photos
labels = rng.integers(0, 10, 256)
MEAN, STD = np.float32([0.485, 0.456, 0.406]), np.float32([0.229, 0.224, 0.225])  # per channel


def examples():
    while True:
        for i in rng.permutation(len(images)):
            image = images[i].astype(np.float32) / 255.0
            top, left = rng.integers(0, SIZE - CROP + 1, size=2)
            image = image[top:top + CROP, left:left + CROP]
            if rng.random() < 0.5:
                image = image[:, ::-1]
            image = image * rng.uniform(0.8, 1.2) + rng.uniform(-0.1, 0.1)  # contrast, brightness
            image = (image - MEAN) / STD
            yield image, labels[i]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    ds = tf.data.Dataset.from_generator(
        examples, output_signature=(tf.TensorSpec((CROP, CROP, 3), tf.float32), tf.TensorSpec((), tf.int64)))
    ds = ds.batch(32).prefetch(tf.data.AUTOTUNE)

    # The generator's work per step must outweigh the model's on a slow CPU too (with 32 filters
    # in the second layer a step took 96 ms on one 2-core box, the generator's share 3 %), and the
    # model's must outweigh what the generator still does after the fix (its hand-over)
    model = keras.Sequential([
        keras.Input((CROP, CROP, 3)),
        keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
        keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, epochs=1, steps_per_epoch=args.steps, verbose=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Planted problem: a custom loop fed by a Python generator that builds each batch in NumPy.
Rule: host-bound, naming the generator's lines and the loop that consumes it.

No tf.data at all: for every batch the generator picks images, crops a random window, flips,
jitters and standardises each one in NumPy, on the training thread, between two steps; the
compiled step waits for it every time. The fix builds the batches in tf.data: the raw arrays
through ``from_tensor_slices``, the same work as TF ops in ``.map(augment,
num_parallel_calls=tf.data.AUTOTUNE)``, batched and prefetched (on tf.data's threads, ahead of
the step).
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import numpy as np
import tensorflow as tf

SIZE, CROP, BATCH = 96, 80, 32
rng = np.random.default_rng(0)
images = rng.integers(0, 256, (512, SIZE, SIZE, 3), dtype=np.uint8)  # stands for decoded photos
labels = rng.integers(0, 10, 512)
MEAN, STD = np.float32([0.485, 0.456, 0.406]), np.float32([0.229, 0.224, 0.225])  # per channel


def batches(steps):
    for _ in range(steps):
        picked = rng.integers(0, len(images), BATCH)
        out = np.empty((BATCH, CROP, CROP, 3), np.float32)
        for j, i in enumerate(picked):
            top, left = rng.integers(0, SIZE - CROP + 1, size=2)
            image = images[i, top:top + CROP, left:left + CROP].astype(np.float32) / 255.0
            if rng.random() < 0.5:
                image = image[:, ::-1]
            image = image * rng.uniform(0.8, 1.2) + rng.uniform(-0.1, 0.1)  # contrast, brightness
            out[j] = (image - MEAN) / STD
        yield out, labels[picked]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=800)
    args = p.parse_args()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([
        tf.keras.Input((CROP, CROP, 3)),
        tf.keras.layers.Conv2D(16, 3, strides=4, activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(10),
    ])
    optimizer = tf.keras.optimizers.Adam()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for step, (x, y) in enumerate(batches(args.steps), start=1):
        loss = train_step(x, y)
        if step % 50 == 0:
            print(f"step {step} loss {float(loss):.4f}", flush=True)
    print(f"done: {args.steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

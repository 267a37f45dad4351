"""Planted problem: a dict "cache" keyed by step keeps every batch's predictions. Rule:
host-memory-growth, naming the line that fills it.

A custom loop that memoises each batch's model outputs by step number (meant for a later
lookup that never comes), as ``.numpy()`` arrays: 0.25 MiB per step, never evicted.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import keras
import numpy as np
import tensorflow as tf


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1200)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.random((8192, 64), dtype=np.float32)
    y = rng.integers(0, 64, 8192)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(1024).prefetch(tf.data.AUTOTUNE)

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1024, activation="relu"),
                              keras.layers.Dense(64)])
    optimizer = keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            logits = model(xb, training=True)
            loss = loss_fn(yb, logits)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, logits

    outputs_by_step: dict[int, np.ndarray] = {}
    for step, (xb, yb) in enumerate(ds.take(args.steps), start=1):
        loss, logits = train_step(xb, yb)
        outputs_by_step[step] = logits.numpy()
        if step % 100 == 0:
            print(f"step {step}  loss {float(loss):.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

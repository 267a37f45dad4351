"""Planted problem: a custom loop keeps every step's outputs as tensors in a list. Rule:
host-memory-growth, naming the line that appends.

The loop collects each batch's logits "to compute the accuracy at the end", as the
``tf.Tensor`` the model returned: 0.25 MiB of tensor buffers per step, which TensorFlow allocates
outside Python (tracemalloc does not see them), never dropped.
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
    features = rng.random((8192, 64), dtype=np.float32)
    targets = rng.integers(0, 64, 8192)
    ds = tf.data.Dataset.from_tensor_slices((features, targets)).repeat().batch(1024).prefetch(tf.data.AUTOTUNE)

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512, activation="relu"),
                              keras.layers.Dense(64)])
    optimizer = keras.optimizers.SGD(0.05)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            logits = model(xb, training=True)
            loss = loss_fn(yb, logits)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, logits

    all_logits = []
    for step, (xb, yb) in enumerate(ds.take(args.steps), start=1):
        loss, logits = train_step(xb, yb)
        all_logits.append(logits)
        if step % 100 == 0:
            print(f"step {step}  loss {float(loss):.4f}", flush=True)
    print(f"kept the logits of {len(all_logits)} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

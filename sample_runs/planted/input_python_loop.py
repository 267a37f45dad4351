"""Planted problem: a small model's custom loop fetching each batch in Python. Rule: input-bound,
naming the ``for`` line and the fetch to move into the step, never a ``prefetch``.

The shape of the "training loop from scratch" guides: MNIST-sized arrays in a
``from_tensor_slices(...).shuffle(...).batch(64)`` dataset, no ``prefetch`` (TensorFlow adds one
after the batch by itself), an MLP whose ``tf.function`` step takes about a millisecond, and a
Python ``for step, (x, y) in enumerate(dataset)`` loop around it. Each eager fetch costs a
few tenths of a millisecond of Python and op dispatch between steps, a large share of so short
a step. The fix passes the iterator into the step and calls ``next`` there.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import numpy as np
import tensorflow as tf


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--examples", type=int, default=20000)
    args = p.parse_args()
    tf.random.set_seed(0)
    rng = np.random.default_rng(0)
    x_train = rng.random((args.examples, 784), dtype=np.float32)
    y_train = rng.integers(0, 10, args.examples)

    train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    train_dataset = train_dataset.shuffle(buffer_size=1024).batch(64)

    inputs = tf.keras.Input(shape=(784,))
    hidden = tf.keras.layers.Dense(64, activation="relu")(inputs)
    hidden = tf.keras.layers.Dense(64, activation="relu")(hidden)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(10)(hidden))
    optimizer = tf.keras.optimizers.SGD(learning_rate=1e-3)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_weights)
        optimizer.apply_gradients(zip(grads, model.trainable_weights))
        return loss

    for epoch in range(args.epochs):
        for step, (x_batch, y_batch) in enumerate(train_dataset):
            loss = train_step(x_batch, y_batch)
            if step % 100 == 0:
                print(f"epoch {epoch} step {step}: loss {float(loss):.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Planted problem: a custom loop under MirroredStrategy keeps every step's per-replica logits in a
list. Rule: host-memory-growth, naming the append line.

The loop keeps what ``strategy.run`` returned for the logits (a PerReplica value holding one
tensor per replica, 1 MiB a step) "to compute metrics at the end": TensorFlow's buffers, outside
Python's allocator, never dropped.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import keras
import numpy as np
import tensorflow as tf

from training_setup import make_strategy


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=600)
    args = p.parse_args()
    strategy = make_strategy(2)
    rng = np.random.default_rng(0)
    x = rng.random((8192, 64), dtype=np.float32)
    y = rng.integers(0, 256, 8192)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(1024).prefetch(tf.data.AUTOTUNE)
    dist = strategy.experimental_distribute_dataset(ds)
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(256)])
        optimizer = keras.optimizers.SGD(0.05)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            logits = model(xb, training=True)
            loss = loss_fn(yb, logits) / 1024.0
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, logits

    @tf.function
    def train_step(it):
        xb, yb = next(it)
        loss, logits = strategy.run(replica_step, args=(xb, yb))
        return strategy.reduce("SUM", loss, axis=None), logits

    it = iter(dist)
    outputs = []
    for step in range(1, args.steps + 1):
        loss, logits = train_step(it)
        outputs.append(logits)
        if step % 100 == 0:
            print(f"step {step} loss {float(loss):.4f}", flush=True)
    print(f"kept {len(outputs)} steps of logits")
    return 0


if __name__ == "__main__":
    sys.exit(main())

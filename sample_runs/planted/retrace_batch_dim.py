"""Planted problem (short run): a step function traced 4 times, once per batch size. Rule:
retrace-storm (info: below the storm threshold, with the fix).

The loop slices batches from in-memory arrays and calls the tf.function step with them; the batch
size changes three times (--batch-sizes, default 64,48,32,16), so the step is traced 4 times.
--steps-per-size (default 25) steps each: 100 steps. (The batch goes to every replica whole:
strategy.run replicates a plain tensor.) The fix: one batch size with drop_remainder=True, or an
input_signature with a None batch dimension.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import tensorflow as tf
import keras
from training_setup import make_strategy, synthetic_mnist


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", default="64,48,32,16")
    p.add_argument("--steps-per-size", type=int, default=25)
    p.add_argument("--replicas", type=int, default=4)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    strategy = make_strategy(args.replicas)
    sizes = [int(s) for s in args.batch_sizes.split(",")]

    images, labels = synthetic_mnist(2048, seed=0)
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            per_example = loss_object(y, model(x, training=True))
            loss = tf.reduce_mean(per_example) / strategy.num_replicas_in_sync  # each replica: the whole batch
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.reduce_mean(per_example)

    @tf.function
    def train_step(x, y):
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(step_fn, args=(x, y)), axis=None)

    steps, start = 0, 0
    for size in sizes:  # planted: the batch size changes
        for _ in range(args.steps_per_size):
            if start + size > len(images):
                start = 0
            x, y = tf.constant(images[start:start + size]), tf.constant(labels[start:start + size])
            start += size
            loss = float(train_step(x, y))
            steps += 1
        print(f"step {steps}  batch {size}  loss {loss:.4f}", flush=True)
    print(f"done: {steps} steps, {train_step.experimental_get_tracing_count()} traces")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Planted problem: a retrace storm. Rule that should fire: retrace-storm.

The train step is a ``@tf.function`` that takes the learning rate as a Python float, and the loop
decays that float every step. A Python scalar argument is part of the trace signature, so every
call traces (and, on TPU, compiles) the whole step again: ``--steps`` traces of the same function
(default 12). TF's "triggered tf.function retracing" warning fires at most twice, so the log alone
hardly shows it. The fix would be ``tf.Variable``/tensor learning rates (or a Keras schedule).
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import tensorflow as tf
import keras
from training_setup import make_strategy, synthetic_mnist


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--batch-per-replica", type=int, default=16)
    args = p.parse_args()
    keras.utils.set_random_seed(0)  # Python, NumPy and TF seeds: weights start the same every run
    tf.random.set_seed(0)
    strategy = make_strategy(args.replicas)
    global_batch = args.batch_per_replica * strategy.num_replicas_in_sync

    images, labels = synthetic_mnist(2048, seed=0)
    ds = (tf.data.Dataset.from_tensor_slices((images, labels)).cache().shuffle(2048, seed=0).repeat()
          .batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
    dist_ds = strategy.experimental_distribute_dataset(ds)

    with strategy.scope():
        model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    @tf.function
    def train_step(batch, learning_rate):
        def step_fn(x, y):
            with tf.GradientTape() as tape:
                per_example = loss_object(y, model(x, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            # Planted: the Python float becomes a constant in the graph -> a new trace per value.
            grads = [g * (learning_rate / 0.1) for g in grads]
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return tf.reduce_mean(per_example)

        per_replica_loss = strategy.run(step_fn, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica_loss, axis=None)

    learning_rate = 0.1
    for step, batch in enumerate(dist_ds, start=1):
        loss = float(train_step(batch, learning_rate))
        learning_rate *= 0.97  # a hand-rolled decay schedule
        print(f"step {step}  lr {learning_rate:.4f}  loss {loss:.4f}", flush=True)
        if step == args.steps:
            break
    print(f"done: {args.steps} steps, train_step traced {train_step.experimental_get_tracing_count()} times")
    return 0


if __name__ == "__main__":
    sys.exit(main())

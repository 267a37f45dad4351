"""Planted problem: a tf.function created anew inside the training loop. Rule: function-recreated.

The loop body wraps the step in ``tf.function(...)`` on every iteration (a common slip when a step
is built by a helper called inside the loop). Each iteration makes a new ``Function`` object that
traces once and is thrown away: each function's own tracing count stays 1 while the process traces
``--steps`` times (default 12). TF's retracing warning does not catch it reliably.
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

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            per_example = loss_object(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.reduce_mean(per_example)

    for step, batch in enumerate(dist_ds, start=1):
        @tf.function  # planted: a new Function object, and a new trace, on every iteration
        def train_step(batch):
            per_replica_loss = strategy.run(step_fn, args=batch)
            return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica_loss, axis=None)

        loss = float(train_step(batch))
        print(f"step {step}  loss {loss:.4f}", flush=True)
        if step == args.steps:
            break
    print(f"done: {args.steps} steps, {args.steps} train_step functions created")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Planted problem: the steps turn many times slower for a while. Rule: slow-steps, with a profile
captured during them.

A custom loop (MirroredStrategy over ``--replicas`` logical CPUs) trains ``--steps`` steps
(default 260) of ~16 ms (a hidden layer of ``--width`` units: enough work that the distributed
batch's fetch, ~0.5 ms, is no input wait to speak of; with no hidden layer the steps took 3.5 ms
on a fast day, the fetch 5-15 % of them, and the agent's input-bound capture took the slowdown's
first steps). From step ``--slow-from`` (default 150) for ``--slow-steps`` steps (default 30)
the script turns on an "auxiliary consistency loss" that multiplies a 384x384 matrix
``--aux-iterations`` times (default 150) inside the compiled step, through a variable, so nothing
retraces: each of those steps takes ~10x longer. The agent captures a profile while they last.
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
    p.add_argument("--steps", type=int, default=260)
    p.add_argument("--slow-from", type=int, default=150)
    p.add_argument("--slow-steps", type=int, default=30)
    p.add_argument("--aux-iterations", type=int, default=150)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--batch-per-replica", type=int, default=32)
    p.add_argument("--width", type=int, default=2048, help="hidden units: the normal step's work")
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    strategy = make_strategy(args.replicas)
    global_batch = args.batch_per_replica * strategy.num_replicas_in_sync

    images, labels = synthetic_mnist(2048, seed=0)
    ds = (tf.data.Dataset.from_tensor_slices((images, labels)).cache().repeat()
          .batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
    iterator = iter(strategy.experimental_distribute_dataset(ds))
    with strategy.scope():
        model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                                  keras.layers.Dense(args.width, activation="relu"), keras.layers.Dense(10)])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        aux_iterations = tf.Variable(0, dtype=tf.int32, trainable=False)
    aux_matrix = tf.random.stateless_normal((384, 384), seed=(1, 2)) / 20.0

    def consistency(m):
        def body(i, acc):
            return i + 1, tf.tanh(tf.matmul(acc, aux_matrix))
        _, out = tf.while_loop(lambda i, _: i < aux_iterations, body, (tf.constant(0), m))
        return tf.reduce_mean(out) * 0.0  # weighs nothing: only its cost shows

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            per_example = loss_object(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.reduce_mean(per_example) + consistency(aux_matrix + 0.0 * tf.reduce_mean(per_example))

    @tf.function
    def train_step(iterator):
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(step_fn, args=next(iterator)), axis=None)

    for step in range(1, args.steps + 1):
        if step == args.slow_from:
            aux_iterations.assign(args.aux_iterations)
            print(f"step {step}: auxiliary consistency loss on", flush=True)
        if step == args.slow_from + args.slow_steps:
            aux_iterations.assign(0)
            print(f"step {step}: auxiliary consistency loss off", flush=True)
        loss = float(train_step(iterator))
        if step % 50 == 0:
            print(f"step {step}  loss {loss:.4f}", flush=True)
    print(f"done: {args.steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

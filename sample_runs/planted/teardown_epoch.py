"""Planted pause: TensorFlow's iterator teardown at each epoch boundary (and, optionally, at the end).

A custom loop under ``MirroredStrategy`` reads ``--steps`` batches an epoch from a tf.data
pipeline whose parallel map is a ``tf.numpy_function`` (a Python decoder), then leaves the epoch
with ``break``. The batch after the epoch's last is slow to decode (``--pause-s``, default 4 s: a
file on a slow share), and the map has already begun it when the loop breaks: deleting the
epoch's iterator waits, in TensorFlow's C++, for that call to end (a Python function cannot be
cancelled), with the process idle. Plain ``python`` pauses the same way.

``--exit-pause-s`` (default 0): ``main`` returns holding an iterator whose next batch is that
slow, so the pause comes as the script ends (after its last step).

It prints what it measured itself: ``planted teardown_s=...`` per epoch boundary (from the
``break`` to the line after the loop) and ``planted exit_teardown_s=...`` (from ``main``'s
``return`` to the line after its call), so a test compares tpuwatch's ledger with the script's
own clock. The pause can outlast the slow batch: the deletion joins tf.data's autotune thread too.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import numpy as np
import tensorflow as tf
import keras
from training_setup import make_strategy, synthetic_mnist


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--pause-s", type=float, default=4.0)
    p.add_argument("--exit-pause-s", type=float, default=0.0)
    p.add_argument("--replicas", type=int, default=2)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    strategy = make_strategy(args.replicas)
    global_batch = 8 * strategy.num_replicas_in_sync
    images, labels = synthetic_mnist(global_batch * (args.steps + 8), seed=0)
    slow_started: list[float] = []

    def decode(index: np.ndarray, x: np.ndarray, slow_at: int, slow_s: float) -> np.ndarray:
        if int(index) == slow_at:
            slow_started.append(time.perf_counter())
            time.sleep(float(slow_s))  # this batch's file is on a slow share
        else:
            time.sleep(0.002)
        return x

    def pipeline(slow_at: int, slow_s: float) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices((images, labels)).batch(global_batch, drop_remainder=True)
        ds = ds.enumerate().map(
            lambda i, xy: (tf.numpy_function(decode, [i, xy[0], slow_at, slow_s], tf.float32, stateful=True), xy[1]),
            num_parallel_calls=tf.data.AUTOTUNE)
        return ds.map(lambda x, y: (tf.ensure_shape(x, (global_batch, 28, 28, 1)), y))

    with strategy.scope():
        model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            per_example = loss_object(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.reduce_mean(per_example)

    @tf.function
    def train_step(x, y):
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(step_fn, args=(x, y)), axis=None)

    train = strategy.experimental_distribute_dataset(pipeline(args.steps, args.pause_s))
    for epoch in range(args.epochs):
        for step, (x, y) in enumerate(train):
            loss = float(train_step(x, y))
            if step + 1 == args.steps:
                t_break = time.perf_counter()
                break  # the epoch's iterator is deleted here, its next (slow) batch in flight
        print(f"planted teardown_s={time.perf_counter() - t_break:.3f}", flush=True)
        print(f"epoch {epoch}: loss {loss:.4f}", flush=True)
    if args.exit_pause_s > 0:
        held = iter(strategy.experimental_distribute_dataset(pipeline(1, args.exit_pause_s)))
        next(held)
        while len(slow_started) < args.epochs + 1:  # its slow batch has begun
            time.sleep(0.01)
    print("done", flush=True)
    RETURNING.append(time.perf_counter())
    return 0  # frees `held` (its slow batch in flight) as the script ends


RETURNING: list[float] = []


if __name__ == "__main__":
    code = main()
    if RETURNING and "--exit-pause-s" in sys.argv:
        print(f"planted exit_teardown_s={time.perf_counter() - RETURNING[-1]:.3f}", flush=True)
    sys.exit(code)

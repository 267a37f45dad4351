"""Planted problem: training stalls -- no step for over a minute -- then goes on. Rule: stall.

It trains ``--steps`` (default 10) steps, then "waits for the evaluation job to take the
checkpoint": it blocks in Python on a lock wait for ``--stall-seconds`` (default 65, more than the
rule's 60 s without a step), with the process alive and idle, then trains ``--steps-after``
(default 5) more steps and exits 0. A stack dump during the stall shows ``wait_for_evaluator``.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import tensorflow as tf
import keras
from training_setup import make_strategy, synthetic_mnist


def wait_for_evaluator(timeout_s: float) -> bool:
    """Block until an evaluator signals that it took the checkpoint (planted: none ever does)."""
    evaluator_done = threading.Event()
    return evaluator_done.wait(timeout_s)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--steps-after", type=int, default=5)
    p.add_argument("--stall-seconds", type=float, default=65.0)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--batch-per-replica", type=int, default=32)
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
        optimizer = keras.optimizers.Adam(1e-3)
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
    def train_step(iterator):
        per_replica_loss = strategy.run(step_fn, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica_loss, axis=None)

    iterator = iter(dist_ds)
    total = args.steps + args.steps_after
    for step in range(1, total + 1):
        loss = float(train_step(iterator))
        print(f"step {step}  loss {loss:.4f}", flush=True)
        if step == args.steps:
            print(f"waiting for the evaluator (up to {args.stall_seconds:g} s)", flush=True)
            t0 = time.monotonic()
            wait_for_evaluator(args.stall_seconds)
            print(f"evaluator wait gave up after {time.monotonic() - t0:.1f} s; training on", flush=True)
    print(f"done: {total} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

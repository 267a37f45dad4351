"""Planted problem (short run): a custom loop with ~1-5 ms steps that hangs in the middle. Rule: stall.

A tiny model (one Dense layer) trains --steps steps (default 300); after step --hang-at
(default 150) the loop blocks --hang-seconds (default 20 s) on a lock nobody releases in time
(as a loop waiting on a dead evaluator or a stuck file read would), then goes on. 20 s is far
below the 60 s live floor, but thousands of step intervals: the report names the gap.
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
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--hang-at", type=int, default=150)
    p.add_argument("--hang-seconds", type=float, default=20.0)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--batch-per-replica", type=int, default=8)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    strategy = make_strategy(args.replicas)
    global_batch = args.batch_per_replica * strategy.num_replicas_in_sync

    images, labels = synthetic_mnist(1024, seed=0)
    ds = (tf.data.Dataset.from_tensor_slices((images, labels)).cache().repeat()
          .batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
    iterator = iter(strategy.experimental_distribute_dataset(ds))
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
    def train_step(iterator):
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(step_fn, args=next(iterator)), axis=None)

    import threading
    evaluator = threading.Lock()
    evaluator.acquire()  # planted: held by an "evaluator" that never finishes
    for step in range(1, args.steps + 1):
        loss = float(train_step(iterator))
        if step % 50 == 0:
            print(f"step {step}  loss {loss:.4f}", flush=True)
        if step == args.hang_at:
            t0 = time.monotonic()
            evaluator.acquire(timeout=args.hang_seconds)
            print(f"waited {time.monotonic() - t0:.1f} s for the evaluator; training on", flush=True)
    print(f"done: {args.steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Planted problem: irregular step times. Rule that should fire: step-time-jitter.

``--source hook`` (default): the train step calls a host-side metrics hook (``tf.numpy_function``)
that, every few steps at irregular intervals (1 step in 3 to 8), blocks for 50-400 ms -- as a
synchronous write to a slow network filesystem does. The time is spent inside the step call.
``--source cpu``: a background thread competes for the CPU in bursts of irregular length (NumPy
matrix products), slowing the steps that overlap a burst -- a weaker signal: measured p95/p50
2.6 with a 15 ms spread here, under the rule's 20 ms minimum spread.
Runs ``--steps`` steps (default 150: the rule wants 100 records and 5 s of step time).
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import numpy as np
import tensorflow as tf
import keras
from training_setup import make_strategy, synthetic_mnist


class MetricsHook:
    """Host-side metrics writer that is sometimes slow (planted)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.calls = 0
        self.next_slow = rng.randint(3, 8)
        self.slow_calls = 0

    def __call__(self, loss: np.ndarray) -> np.ndarray:
        self.calls += 1
        if self.calls >= self.next_slow:
            self.next_slow = self.calls + self.rng.randint(3, 8)
            self.slow_calls += 1
            time.sleep(self.rng.uniform(0.05, 0.4))  # a flush that hit a slow filesystem
        return loss


def burn_cpu(stop: threading.Event, rng: random.Random, threads: int = 4) -> None:
    """Compete for the CPU in bursts of irregular length, with idle gaps between them.

    Each burst runs ``threads`` threads of NumPy matrix products (they release the GIL), as a
    co-located job or an over-eager data-augmentation pool would.
    """
    def work(end: float) -> None:
        a = np.random.default_rng(0).random((384, 384))
        while time.monotonic() < end and not stop.is_set():
            a = np.tanh(a @ a)

    while not stop.is_set():
        stop.wait(rng.uniform(0.4, 1.2))
        end = time.monotonic() + rng.uniform(0.1, 0.4)
        burst = [threading.Thread(target=work, args=(end,), daemon=True) for _ in range(threads)]
        for t in burst:
            t.start()
        for t in burst:
            t.join()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--source", choices=("hook", "cpu"), default="hook")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--batch-per-replica", type=int, default=32)
    args = p.parse_args()
    keras.utils.set_random_seed(0)  # Python, NumPy and TF seeds: weights start the same every run
    tf.random.set_seed(0)
    rng = random.Random(0)
    strategy = make_strategy(args.replicas)
    global_batch = args.batch_per_replica * strategy.num_replicas_in_sync

    images, labels = synthetic_mnist(4096, seed=0)
    ds = (tf.data.Dataset.from_tensor_slices((images, labels)).cache().shuffle(4096, seed=0).repeat()
          .batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
    dist_ds = strategy.experimental_distribute_dataset(ds)

    with strategy.scope():
        model = keras.Sequential([
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ])
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    hook = MetricsHook(rng)
    use_hook = args.source == "hook"

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
        loss = strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica_loss, axis=None)
        if use_hook:
            loss = tf.numpy_function(hook, [loss], tf.float32, stateful=True)
        return loss

    stop = threading.Event()
    burner = threading.Thread(target=burn_cpu, args=(stop, rng), daemon=True)
    if not use_hook:
        burner.start()
    iterator = iter(dist_ds)
    times_s = []
    try:
        for step in range(1, args.steps + 1):
            t0 = time.perf_counter()
            loss = float(train_step(iterator))
            times_s.append(time.perf_counter() - t0)
            if step % 25 == 0:
                print(f"step {step}  loss {loss:.4f}  last {1000 * times_s[-1]:.0f} ms", flush=True)
    finally:
        stop.set()
    p50, p95 = np.percentile(times_s[5:], [50, 95])
    print(f"done: {args.steps} steps, step time p50 {1000 * p50:.0f} ms, p95 {1000 * p95:.0f} ms "
          f"(p95/p50 {p95 / p50:.1f}), {hook.slow_calls} slow hook calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Multi-worker training with MultiWorkerMirroredStrategy and a custom training loop.

This follows the TensorFlow guide "Custom training loop with Keras and MultiWorkerMirroredStrategy".
Start one process per worker, each with ``TF_CONFIG`` naming the cluster and its own index, e.g.

    TF_CONFIG='{"cluster": {"worker": ["localhost:12345", "localhost:23456"]},
                "task": {"type": "worker", "index": 0}}' python sample_runs/multi_worker.py
    (and the same with "index": 1 in a second shell)

Without ``TF_CONFIG`` it runs as a single worker. Each worker trains on one CPU device; a custom loop
is used because Keras 3.15 ``model.fit`` fails under this strategy (keras-team/keras#20585).
Each worker reads its own shard through ``distribute_datasets_from_function``; with
``--global-dataset`` one global-batch pipeline goes through ``experimental_distribute_dataset``
instead, which tf.distribute shards across the workers itself (auto-shard by data).

Switch that plants a problem on purpose:
  --slow-worker INDEX   that worker's input pipeline sleeps ``--slow-ms`` (default 200 ms) per batch
                        with no prefetch, making it a straggler: every step of every worker waits
                        for it in the gradient all-reduce.

Each worker prints the reduced (all-worker mean) loss per step and, at the end, its median step time.
``--loss-log PATH`` writes ``step,reduced_loss`` per step.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import numpy as np
import tensorflow as tf
import keras

IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch-per-worker", type=int, default=32)
    p.add_argument("--slow-worker", type=int, metavar="INDEX", help="plant: this worker's input sleeps per batch")
    p.add_argument("--slow-ms", type=float, default=200.0)
    p.add_argument("--loss-log", metavar="PATH", help="write 'step,reduced_loss' per step to PATH")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--global-dataset", action="store_true",
                   help="one global-batch dataset through experimental_distribute_dataset (auto-sharded)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch_per_worker < 1:
        p.error("--steps and --batch-per-worker must be at least 1")
    return args


def synthetic_mnist(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    templates = rng.random((NUM_CLASSES, *IMAGE_SHAPE), dtype=np.float32)
    labels = rng.integers(0, NUM_CLASSES, n)
    noise = rng.random((n, *IMAGE_SHAPE), dtype=np.float32)
    return (0.5 * templates[labels] + 0.5 * noise).astype(np.float32), labels.astype(np.int64)


def sleepy(images: np.ndarray, delay_s: float) -> np.ndarray:
    time.sleep(delay_s)  # stands in for a worker with a slow disk or an overloaded host
    return images


def make_model() -> keras.Model:
    return keras.Sequential([
        keras.Input(IMAGE_SHAPE),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(NUM_CLASSES),
    ])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tf.random.set_seed(args.seed)
    keras.utils.set_random_seed(args.seed)
    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    workers = len(tf_config.get("cluster", {}).get("worker", [])) or 1
    if args.slow_worker is not None and not 0 <= args.slow_worker < workers:
        print(f"multi_worker.py: --slow-worker {args.slow_worker} is not a worker index (0..{workers - 1})",
              file=sys.stderr)
        return 2

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = strategy.cluster_resolver.task_id or 0
    global_batch = args.batch_per_worker * workers
    print(f"worker {task} of {workers}: {strategy.num_replicas_in_sync} replicas in sync, "
          f"global batch {global_batch}", flush=True)

    with strategy.scope():
        model = make_model()
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)  # slots now, not inside the traced step
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    slow = args.slow_worker == task

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        images, labels = synthetic_mnist(4096, args.seed)
        ds = tf.data.Dataset.from_tensor_slices((images, labels))
        ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).cache()
        ds = ds.shuffle(1024, seed=args.seed).repeat()
        ds = ds.batch(ctx.get_per_replica_batch_size(global_batch), drop_remainder=True)
        if not slow:
            return ds.prefetch(tf.data.AUTOTUNE)
        delay_s = args.slow_ms / 1000.0

        def slowed(x, y):
            x2 = tf.numpy_function(lambda a: sleepy(a, delay_s), [x], tf.float32, stateful=True)
            x2.set_shape(x.shape)
            return x2, y

        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False
        options.autotune.enabled = False
        return ds.map(slowed).with_options(options)

    if args.global_dataset:
        images, labels = synthetic_mnist(4096, args.seed)
        ds = tf.data.Dataset.from_tensor_slices((images, labels)).cache()
        ds = ds.shuffle(1024, seed=args.seed).repeat().batch(global_batch, drop_remainder=True)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        dist_dataset = strategy.experimental_distribute_dataset(ds.with_options(options).prefetch(2))
    else:
        dist_dataset = strategy.distribute_datasets_from_function(dataset_fn)

    def step_fn(images, labels):
        with tf.GradientTape() as tape:
            per_example = loss_object(labels, model(images, training=True))
            scaled = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.reduce_mean(per_example)

    @tf.function
    def train_step(iterator):
        images, labels = next(iterator)
        per_replica_loss = strategy.run(step_fn, args=(images, labels))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica_loss, axis=None)

    iterator = iter(dist_dataset)
    loss_log = open(args.loss_log, "w") if args.loss_log else None
    per_step_s: list[float] = []
    try:
        for step in range(1, args.steps + 1):
            t0 = time.perf_counter()
            loss = float(train_step(iterator))
            per_step_s.append(time.perf_counter() - t0)
            if loss_log:
                loss_log.write(f"{step},{loss!r}\n")
            print(f"worker {task} step {step:4d}  loss {loss:.4f}  {1000 * per_step_s[-1]:.0f} ms", flush=True)
    finally:
        if loss_log:
            loss_log.close()
    median_ms = 1000.0 * float(np.median(per_step_s[1:] or per_step_s))
    print(f"worker {task} done: {args.steps} steps, median {median_ms:.1f} ms/step (first step left out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Planted problem: one worker of a multi-worker run stops in its own Python. Rule: stall, naming
the worker that has not arrived.

A MultiWorkerMirroredStrategy custom loop (run it under ``tpuwatch run --workers 2``: one process
per worker, ``TF_CONFIG`` set by tpuwatch). After step ``--hang-at`` (default 20) worker
``--hang-worker`` (default 1) "uploads its metrics" for ``--hang-seconds`` (default 30) before
its next step; the other workers' next step waits in its all-reduce for it. Each worker's stall
finding says where it waits: the late one at its own line, the others inside the step, waiting
for that worker.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import keras
import numpy as np
import tensorflow as tf


def upload_metrics(seconds: float) -> None:
    """Stands for a blocking call to a metrics service that is slow to answer."""
    time.sleep(seconds)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--hang-at", type=int, default=20)
    p.add_argument("--hang-worker", type=int, default=1)
    p.add_argument("--hang-seconds", type=float, default=30.0)
    p.add_argument("--batch-per-worker", type=int, default=16)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    workers = len(tf_config.get("cluster", {}).get("worker", [])) or 1
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = strategy.cluster_resolver.task_id or 0
    global_batch = args.batch_per_worker * workers

    with strategy.scope():
        model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        rng = np.random.default_rng(ctx.input_pipeline_id)
        images = rng.random((512, 28, 28, 1), dtype=np.float32)
        labels = rng.integers(0, 10, 512)
        ds = tf.data.Dataset.from_tensor_slices((images, labels)).cache().repeat()
        return ds.batch(ctx.get_per_replica_batch_size(global_batch), drop_remainder=True).prefetch(2)

    dist_dataset = strategy.distribute_datasets_from_function(dataset_fn)

    def step_fn(images, labels):
        with tf.GradientTape() as tape:
            per_example = loss_object(labels, model(images, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.reduce_mean(per_example)

    @tf.function
    def train_step(iterator):
        per_replica_loss = strategy.run(step_fn, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica_loss, axis=None)

    iterator = iter(dist_dataset)
    for step in range(1, args.steps + 1):
        loss = float(train_step(iterator))
        print(f"worker {task} step {step}  loss {loss:.4f}", flush=True)
        if step == args.hang_at and task == args.hang_worker:
            upload_metrics(args.hang_seconds)
    print(f"worker {task} done: {args.steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

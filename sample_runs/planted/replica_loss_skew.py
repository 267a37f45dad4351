"""Planted problem: one replica's data is much worse than the others'. Rule: replica-loss-skew.

Input comes from ``strategy.distribute_datasets_from_function``, batched per replica. With
MirroredStrategy each worker's pipeline hands replica r the batches r, r+R, r+2R, ... (R replicas),
so the pipeline corrupts every batch whose index is ``--bad-replica`` (default 2) modulo R: their
labels are replaced by random ones, as if that shard were mislabelled. That replica's loss stays
at or above ln(10) = 2.30 (measured 2.3-3.7) while the others fall below 0.3, for all ``--steps``
(default 80: the rule wants 16 steps with every replica's loss, over 50 steps; where the agent reads
losses at its default pace rather than after every call, a few of 80 tiny steps are read: its
reads are budgeted by training time, so run 300 steps of ``--batch-per-replica 128 --hidden 1024``,
~30 ms each on a 2-core CPU box).
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
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--bad-replica", type=int, default=2)
    p.add_argument("--batch-per-replica", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64, help="the hidden layer's units (more: a longer step)")
    args = p.parse_args()
    keras.utils.set_random_seed(0)  # Python, NumPy and TF seeds: weights start the same every run
    tf.random.set_seed(0)
    strategy = make_strategy(args.replicas)
    replicas = strategy.num_replicas_in_sync
    if not 0 <= args.bad_replica < replicas:
        p.error(f"--bad-replica must be in 0..{replicas - 1}")
    global_batch = args.batch_per_replica * replicas
    images, labels = synthetic_mnist(4096, seed=0)

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = ctx.get_per_replica_batch_size(global_batch)
        ds = tf.data.Dataset.from_tensor_slices((images, labels))
        ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).cache().shuffle(4096, seed=0).repeat()
        ds = ds.batch(batch, drop_remainder=True).enumerate()

        def mislabel(i, xy):
            x, y = xy
            noisy = tf.random.stateless_uniform(tf.shape(y), [1, i], 0, 10, tf.int64)
            bad = (i % ctx.num_replicas_in_sync) == args.bad_replica  # planted: one replica's shard
            return x, tf.where(bad, noisy, y)

        return ds.map(mislabel, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)

    dist_ds = strategy.distribute_datasets_from_function(dataset_fn)

    with strategy.scope():
        model = keras.Sequential([
            keras.Input((28, 28, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(args.hidden, activation="relu"),
            keras.layers.Dense(10),
        ])
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
        return per_replica_loss, strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica_loss, axis=None)

    iterator = iter(dist_ds)
    for step in range(1, args.steps + 1):
        per_replica_loss, loss = train_step(iterator)
        if step % 10 == 0 or step == args.steps:
            each = " ".join(f"{float(v):.3f}" for v in strategy.experimental_local_results(per_replica_loss))
            print(f"step {step}  loss {float(loss):.4f}  per replica [{each}]", flush=True)
    print(f"done: {args.steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Planted phases: a custom training loop whose wall time goes to known places (goodput ledger).

Shaped like the TF guide's distributed custom loop: ``strategy.run`` inside a ``tf.function``
train step, a test step that computes no gradient over a test set after every epoch, and a
``tf.train.CheckpointManager`` save after each epoch. Planted amounts:

- ``--sleep-before-s`` (default 3): Python sleeps before the first step ("loading data");
- ``--eval-batch-s`` x ``--eval-batches`` (default 0.3 s x 40 = 12 s): after epoch 1 the test
  set's pipeline sleeps that long per batch, so the evaluation takes longer than the stall
  rule's 10 s limit for a finished gap while its test steps keep coming;
- ``--hang-s`` (default 0): after the last epoch, Python blocks that long between two steps
  with nothing running (a real hang; the stall rule must still call it one).

It prints what it measured itself, one line each: ``planted sleep_before_s=...``,
``planted evaluating_s=...`` (every evaluation pass), ``planted checkpointing_s=...`` (every
save), ``planted hang_s=...``, so a test compares tpuwatch's ledger with the script's own clock.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf
import keras
from training_setup import make_strategy, synthetic_mnist


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps-per-epoch", type=int, default=30)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--sleep-before-s", type=float, default=3.0)
    p.add_argument("--eval-batch-s", type=float, default=0.3)
    p.add_argument("--eval-batches", type=int, default=40)
    p.add_argument("--hang-s", type=float, default=0.0)
    args = p.parse_args()
    tf.random.set_seed(0)
    strategy = make_strategy(args.replicas)
    global_batch = 16 * strategy.num_replicas_in_sync

    t0 = time.perf_counter()
    time.sleep(args.sleep_before_s)  # stands in for reading the data set from a slow disk
    print(f"planted sleep_before_s={time.perf_counter() - t0:.3f}", flush=True)

    x, y = synthetic_mnist(global_batch * args.steps_per_epoch, 0)
    train = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch, drop_remainder=True)
    train_dist = strategy.experimental_distribute_dataset(train)

    def slow_read(images):
        time.sleep(args.eval_batch_s)  # a test set on a slow network share
        return images

    def slow(images, labels):
        images = tf.numpy_function(slow_read, [images], tf.float32, stateful=True)
        images.set_shape([global_batch, 28, 28, 1])
        return images, labels

    tx, ty = synthetic_mnist(global_batch * args.eval_batches, 1)
    test = tf.data.Dataset.from_tensor_slices((tx, ty)).batch(global_batch, drop_remainder=True).map(slow)
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    options.autotune.enabled = False
    test_dist = strategy.experimental_distribute_dataset(test.with_options(options))

    with strategy.scope():
        model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                                  keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
        optimizer = keras.optimizers.SGD(0.05)
        optimizer.build(model.trainable_variables)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
        test_loss = keras.metrics.Mean()
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, tempfile.mkdtemp(prefix="phases-ckpt-"), max_to_keep=2)

    def train_step(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(labels, model(images, training=True)),
                                              global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def test_step(inputs):
        images, labels = inputs
        test_loss.update_state(loss_fn(labels, model(images, training=False)))

    @tf.function
    def distributed_train_step(inputs):
        losses = strategy.run(train_step, args=(inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    @tf.function
    def distributed_test_step(inputs):
        strategy.run(test_step, args=(inputs,))

    for epoch in range(args.epochs):
        total = 0.0
        for batch in train_dist:
            total += float(distributed_train_step(batch))
        if epoch == args.epochs - 1 and args.hang_s > 0:
            t = time.perf_counter()
            threading.Event().wait(args.hang_s)  # waits for a peer that never answers
            print(f"planted hang_s={time.perf_counter() - t:.3f}", flush=True)
            for batch in train_dist:
                distributed_train_step(batch)
                break
        if epoch == 0:
            t = time.perf_counter()
            for batch in test_dist:
                distributed_test_step(batch)
            print(f"planted evaluating_s={time.perf_counter() - t:.3f}", flush=True)
        t = time.perf_counter()
        manager.save()
        print(f"planted checkpointing_s={time.perf_counter() - t:.3f}", flush=True)
        print(f"epoch {epoch + 1}: loss {total / args.steps_per_epoch:.4f}, test loss {float(test_loss.result()):.4f}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

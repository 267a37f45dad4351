"""A short run shaped like TensorFlow's distributed custom-training tutorial, timing its own steps.

``for batch in dist_dataset: train_step(batch)`` over epochs, ``strategy.run`` of a replica step
that returns ``tf.nn.compute_average_loss`` (scaled by the global batch), reduced with
``strategy.reduce(SUM)``; a small convolutional model on synthetic 28x28 images; MirroredStrategy
over ``--replicas`` logical CPU devices. The script times each step itself (``perf_counter``
around the call, the loss read with ``float`` as the tutorial's logging does every step is not in
it) and prints one line: ``steps=N median_ms=M`` over the steps within epochs (each epoch's first
step and the first epoch left out: the boundaries are TensorFlow's, not a step's).

    python bench/_tutorial_loop.py [--replicas 4] [--steps 300] [--epochs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def build(strategy, per_epoch: int):
    """The tutorial's pieces under ``strategy``: its distributed dataset of ``per_epoch`` batches
    of 16 examples a replica, and its ``train_step`` (a Python function, for ``tf.function``)."""
    import tensorflow as tf

    per_replica = 16
    global_batch = per_replica * strategy.num_replicas_in_sync
    images = tf.random.uniform([global_batch * per_epoch, 28, 28, 1], seed=1)
    labels = tf.random.uniform([global_batch * per_epoch], maxval=10, dtype=tf.int64, seed=2)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(1024).batch(global_batch)
    dist_dataset = strategy.experimental_distribute_dataset(dataset)

    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input((28, 28, 1)),
            tf.keras.layers.Conv2D(16, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ])
        optimizer = tf.keras.optimizers.Adam()
        optimizer.build(model.trainable_variables)
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=tf.keras.losses.Reduction.NONE)

    def replica_step(inputs):
        x, y = inputs
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_object(y, model(x, training=True)), global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def train_step(inputs):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=(inputs,)), axis=None)

    return dist_dataset, train_step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--steps", type=int, default=300, help="steps in all, over the epochs")
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args()

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(a.replicas)])
    dist_dataset, step = build(strategy, a.steps // a.epochs)
    train_step = tf.function(step)

    within = []
    steps = 0
    for epoch in range(a.epochs):
        total = 0.0
        for i, batch in enumerate(dist_dataset):
            start = time.perf_counter()
            loss = train_step(batch)
            elapsed = time.perf_counter() - start
            total += float(loss)
            steps += 1
            if epoch > 0 and i > 0:
                within.append(elapsed)
    print(f"steps={steps} median_ms={statistics.median(within) * 1e3:.4f}", flush=True)


if __name__ == "__main__":
    main()

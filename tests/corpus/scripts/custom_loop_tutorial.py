"""A custom training loop in the shape of TensorFlow's "Custom training with tf.distribute" tutorial
(synthetic MNIST-shaped data; our own words). Per replica: ``tf.nn.compute_average_loss`` over the
global batch (optionally plus ``tf.nn.scale_regularization_loss``), reduced with SUM; a test step
each epoch; a checkpoint each epoch. ``--reduction mean`` takes each replica's mean and reduces
with MEAN; ``--reduction manual`` divides by the global batch by hand and reduces with SUM.

Prints ``train step N loss X`` for every training step, as a user debugging a loop would.
"""

import argparse
import os
import sys

import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--replicas", type=int, default=4)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--batches", type=int, default=6, help="training batches per epoch")
p.add_argument("--reduction", choices=["sum", "mean", "manual"], default="sum")
p.add_argument("--regularize", action="store_true")
p.add_argument("--checkpoint-dir", default="")
p.add_argument("--run-functions-eagerly", action="store_true",
               help="tf.config.run_functions_eagerly(True), as the tutorial suggests for debugging")
a = p.parse_args()
if a.run_functions_eagerly:
    tf.config.run_functions_eagerly(True)

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
strategy = tf.distribute.MirroredStrategy()
print("Number of devices:", strategy.num_replicas_in_sync)

BATCH_SIZE_PER_REPLICA = 8
GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync

tf.random.set_seed(7)
images = tf.random.uniform([GLOBAL_BATCH_SIZE * a.batches, 28, 28, 1])
labels = tf.random.uniform([GLOBAL_BATCH_SIZE * a.batches], maxval=10, dtype=tf.int64)
test_images = tf.random.uniform([GLOBAL_BATCH_SIZE * 2, 28, 28, 1])
test_labels = tf.random.uniform([GLOBAL_BATCH_SIZE * 2], maxval=10, dtype=tf.int64)

train_dataset = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(256).batch(GLOBAL_BATCH_SIZE)
test_dataset = tf.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(GLOBAL_BATCH_SIZE)
train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)


def create_model():
    regularizer = tf.keras.regularizers.L2(1e-3) if a.regularize else None
    return tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu", kernel_regularizer=regularizer),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu", kernel_regularizer=regularizer),
        tf.keras.layers.Dense(10),
    ])


checkpoint_dir = a.checkpoint_dir or os.path.join(os.getcwd(), "training_checkpoints")
checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt")

with strategy.scope():
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def compute_loss(labels, predictions, model_losses):
        per_example_loss = loss_object(labels, predictions)
        if a.reduction == "sum":
            loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH_SIZE)
        elif a.reduction == "manual":
            loss = tf.reduce_sum(per_example_loss) * (1.0 / GLOBAL_BATCH_SIZE)
        else:
            loss = tf.reduce_mean(per_example_loss)
        if model_losses:
            extra = tf.add_n(model_losses)
            loss += tf.nn.scale_regularization_loss(extra) if a.reduction != "mean" else extra
        return loss

    test_loss = tf.keras.metrics.Mean(name="test_loss")
    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
    test_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")
    model = create_model()
    optimizer = tf.keras.optimizers.Adam(learning_rate=0.001)
    # Keras 3 makes Adam's slots lazily; inside a distributed step that fails. Build them here.
    optimizer.build(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)


def train_step(inputs):
    images, labels = inputs
    with tf.GradientTape() as tape:
        predictions = model(images, training=True)
        loss = compute_loss(labels, predictions, model.losses)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    train_accuracy.update_state(labels, predictions)
    return loss


def test_step(inputs):
    images, labels = inputs
    predictions = model(images, training=False)
    t_loss = loss_object(labels, predictions)
    test_loss.update_state(t_loss)
    test_accuracy.update_state(labels, predictions)


REDUCE = tf.distribute.ReduceOp.MEAN if a.reduction == "mean" else tf.distribute.ReduceOp.SUM


@tf.function
def distributed_train_step(dataset_inputs):
    per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
    return strategy.reduce(REDUCE, per_replica_losses, axis=None)


@tf.function
def distributed_test_step(dataset_inputs):
    return strategy.run(test_step, args=(dataset_inputs,))


step = 0
for epoch in range(a.epochs):
    total_loss = 0.0
    num_batches = 0
    for x in train_dist_dataset:
        loss = distributed_train_step(x)
        step += 1
        print(f"train step {step} loss {float(loss)!r}")
        total_loss += loss
        num_batches += 1
    train_loss = total_loss / num_batches
    for x in test_dist_dataset:
        distributed_test_step(x)
    checkpoint.save(checkpoint_prefix)
    print(f"Epoch {epoch + 1}, Loss: {float(train_loss):.4f}, Accuracy: {train_accuracy.result() * 100:.2f}, "
          f"Test Loss: {test_loss.result():.4f}, Test Accuracy: {test_accuracy.result() * 100:.2f}")
    test_loss.reset_state()
    train_accuracy.reset_state()
    test_accuracy.reset_state()
print(f"trained {step} steps", file=sys.stderr)

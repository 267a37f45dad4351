"""A whole epoch inside one tf.function: ``for x in dist_dataset`` is traced into a loop (the shape
of the last section of TensorFlow's custom-training tutorial; our own words). Each epoch call
returns the summed loss and the batch count; the script prints ``epoch N batches B loss X``.
"""

import argparse

import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--replicas", type=int, default=4)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--batches", type=int, default=5)
a = p.parse_args()

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
strategy = tf.distribute.MirroredStrategy()
GLOBAL_BATCH = 8 * strategy.num_replicas_in_sync

features = tf.random.normal([GLOBAL_BATCH * a.batches, 16], seed=3)
targets = tf.reduce_sum(features[:, :4], axis=1, keepdims=True)
dataset = tf.data.Dataset.from_tensor_slices((features, targets)).batch(GLOBAL_BATCH)
dist_dataset = strategy.experimental_distribute_dataset(dataset)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.05)
    mse = tf.keras.losses.MeanSquaredError(reduction="none")


def replica_step(inputs):
    x, y = inputs
    with tf.GradientTape() as tape:
        per_example = mse(y, model(x, training=True))
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function
def train_epoch(dist_dataset):
    total = 0.0
    batches = 0
    for x in dist_dataset:
        total += strategy.reduce("SUM", strategy.run(replica_step, args=(x,)), axis=None)
        batches += 1
    return total, batches


for epoch in range(a.epochs):
    total, batches = train_epoch(dist_dataset)
    print(f"epoch {epoch + 1} batches {int(batches)} loss {float(total / tf.cast(batches, tf.float32))!r}")

"""An input-bound custom loop over 4 logical CPUs whose input is made per replica
(``distribute_datasets_from_function``): each replica's batch takes 4 ms of the host pipeline (a
``tf.numpy_function`` that sleeps), the step itself a few milliseconds, and the batch is fetched
inside the step. Most of each step is the wait for the last replica's part: a multi-device
iterator hands the host pipeline's elements to the devices in turn."""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(4)])


def slow(x):
    time.sleep(0.004)
    return x


def dataset_fn(ctx):
    ds = tf.data.Dataset.from_tensor_slices(np.random.rand(4096, 16).astype(np.float32)).repeat()
    ds = ds.batch(ctx.get_per_replica_batch_size(64), drop_remainder=True)
    ds = ds.map(lambda x: tf.numpy_function(slow, [x], tf.float32))
    return ds.map(lambda x: tf.ensure_shape(x, (16, 16)))


with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(8), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.01)


def replica_step(x):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True)))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss


@tf.function
def train_step(iterator):
    return strategy.reduce("MEAN", strategy.run(replica_step, args=(next(iterator),)), axis=None)


iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
start = time.perf_counter()
for _ in range(120):
    train_step(iterator)
print(f"120 steps, {1000 * (time.perf_counter() - start) / 120:.1f} ms a step")

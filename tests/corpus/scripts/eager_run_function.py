"""``strategy.run`` called eagerly with a tf.function replica step (what TPUStrategy requires of an
eager call; our own words). Prints ``step N loss X`` with the loss reduced by MEAN eagerly."""

import argparse

import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--replicas", type=int, default=2)
p.add_argument("--steps", type=int, default=6)
a = p.parse_args()

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
strategy = tf.distribute.MirroredStrategy()
batch = 8 * strategy.num_replicas_in_sync
x = tf.random.normal([batch * a.steps, 4], seed=5)
y = tf.reduce_mean(x, axis=1, keepdims=True)
dist = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch))

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.1)


@tf.function
def replica_step(inputs):
    features, labels = inputs
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(features, training=True) - labels))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss


for i, inputs in enumerate(dist):
    per_replica = strategy.run(replica_step, args=(inputs,))
    print(f"step {i + 1} loss {float(strategy.reduce('MEAN', per_replica, axis=None))!r}")

"""Several phases in one script (our own words): a Keras ``fit`` on one model, a second ``fit``,
then a custom loop with its own tf.function step, then a multi-step ``tf.range`` loop. Prints
``phase P steps N`` after each phase and ``custom step N loss X`` in the custom loop."""

import argparse

import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--replicas", type=int, default=2)
a = p.parse_args()

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
strategy = tf.distribute.MirroredStrategy()
BATCH = 8 * strategy.num_replicas_in_sync
x = tf.random.normal([BATCH * 4, 6], seed=2)
y = tf.reduce_sum(x, axis=1, keepdims=True)
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)


def make_model():
    m = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(1)])
    m.compile(optimizer="sgd", loss="mse")
    return m


with strategy.scope():
    first = make_model()
first.fit(ds, epochs=2, verbose=0)
print("phase 1 steps 8")
with strategy.scope():
    second = make_model()
second.fit(ds, epochs=1, verbose=0)
print("phase 2 steps 4")

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.05)


def replica_fn(inputs):
    features, target = inputs
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(tf.square(model(features) - target)[:, 0])
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss


@tf.function
def custom_step(batch):
    return strategy.reduce("SUM", strategy.run(replica_fn, args=(batch,)), axis=None)


n = 0
for batch in strategy.experimental_distribute_dataset(ds):
    n += 1
    print(f"custom step {n} loss {float(custom_step(batch))!r}")
print(f"phase 3 steps {n}")

iterator = iter(strategy.experimental_distribute_dataset(ds.repeat()))


@tf.function
def multi_step(it, k):
    for _ in tf.range(k):
        strategy.run(replica_fn, args=(next(it),))


multi_step(iterator, tf.constant(3))
multi_step(iterator, tf.constant(3))
print("phase 4 steps 6")

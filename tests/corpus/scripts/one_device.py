"""OneDeviceStrategy with a tf.function step around ``strategy.run`` (our own words). Prints
``step N loss X`` per step."""

import argparse

import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=10)
a = p.parse_args()

strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
x = tf.random.normal([32 * a.steps, 10], seed=1)
y = tf.cast(tf.reduce_sum(x, axis=1) > 0, tf.int32)
ds = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(32))

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((10,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(2)])
    optimizer = tf.keras.optimizers.RMSprop(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@tf.function
def train_step(batch):
    def step(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(features, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return strategy.reduce("MEAN", strategy.run(step, args=(batch,)), axis=None)


for i, batch in enumerate(ds):
    print(f"step {i + 1} loss {float(train_step(batch))!r}")

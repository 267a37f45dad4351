"""A custom loop in the shape of TensorFlow's "Mixed precision" guide (our own words, synthetic
data): a ``mixed_float16`` policy, a float32 output layer, a ``LossScaleOptimizer``, and a step
that takes the gradient of the *scaled* loss (Keras 3: ``optimizer.scale_loss``; tf_keras under
``TF_USE_LEGACY_KERAS=1``: ``get_scaled_loss`` and ``get_unscaled_gradients``) and returns the
unscaled one. With ``--replicas N`` > 1 the step runs under MirroredStrategy with the tutorials'
``compute_average_loss`` and a SUM reduction.

Prints ``step N loss X`` after every step, the loss the step computes (not the scaled one).
"""

import argparse
import os

import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--replicas", type=int, default=1)
p.add_argument("--steps", type=int, default=6)
a = p.parse_args()

legacy = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
keras = tf.keras
keras.mixed_precision.set_global_policy("mixed_float16")

if a.replicas > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
    strategy = tf.distribute.MirroredStrategy()
else:
    strategy = tf.distribute.get_strategy()
GLOBAL_BATCH = 32 * strategy.num_replicas_in_sync

tf.random.set_seed(3)
x = tf.random.uniform([GLOBAL_BATCH * a.steps, 64])
y = tf.random.uniform([GLOBAL_BATCH * a.steps], maxval=10, dtype=tf.int64)
dataset = strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH, drop_remainder=True))

with strategy.scope():
    inputs = keras.Input((64,))
    hidden = keras.layers.Dense(128, activation="relu")(inputs)
    logits = keras.layers.Dense(10)(hidden)
    outputs = keras.layers.Activation("softmax", dtype="float32")(logits)  # float32 at the end
    model = keras.Model(inputs, outputs)
    optimizer = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.05))
    if not legacy:
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction="none")


def replica_step(features, labels):
    with tf.GradientTape() as tape:
        per_example = loss_fn(labels, model(features, training=True))
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
        scaled = optimizer.get_scaled_loss(loss) if legacy else optimizer.scale_loss(loss)
    grads = tape.gradient(scaled, model.trainable_variables)
    if legacy:
        grads = optimizer.get_unscaled_gradients(grads)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function
def train_step(features, labels):
    per_replica = strategy.run(replica_step, args=(features, labels))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


for step, (features, labels) in enumerate(dataset, start=1):
    print(f"step {step} loss {float(train_step(features, labels))!r}", flush=True)

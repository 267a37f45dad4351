"""A custom loop whose step takes one batch from each of two iterators (real examples and the
noise a generator-style model mixes in), several steps a call in a Python loop, each step a
``strategy.run`` on the default strategy, called until
either dataset runs out. With ``--noise-batches`` one more than ``--batches``, the last step's
first fetch finds a batch and its second does not: that step never ran.

Prints the steps whose two batches were both there, and the optimizer's iterations."""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--batches", type=int, default=10)
p.add_argument("--noise-batches", type=int, default=11)
p.add_argument("--steps-per-call", type=int, default=4)
a = p.parse_args()

BATCH = 8
images = tf.data.Dataset.from_tensor_slices(tf.random.normal([BATCH * a.batches, 12], seed=1)).batch(BATCH)
noise = tf.data.Dataset.from_tensor_slices(tf.random.normal([BATCH * a.noise_batches, 12], seed=2)).batch(BATCH)
model = tf.keras.Sequential([tf.keras.Input((12,)), tf.keras.layers.Dense(16, activation="relu"),
                             tf.keras.layers.Dense(12)])
optimizer = tf.keras.optimizers.SGD(0.01)


strategy = tf.distribute.get_strategy()  # the default: one device


def step(x, z):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x + 0.1 * z, training=True) - x))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function
def train_steps(image_it, noise_it):
    for _ in range(a.steps_per_call):
        x = next(image_it)
        z = next(noise_it)
        strategy.run(step, args=(x, z))


image_it, noise_it = iter(images), iter(noise)
calls = 0
while True:
    try:
        train_steps(image_it, noise_it)
    except tf.errors.OutOfRangeError:
        break
    calls += 1
print(f"{calls} whole calls; {min(a.batches, a.noise_batches)} steps had both batches; "
      f"optimizer iterations {int(optimizer.iterations.numpy())}")

"""Crash: the official custom-training tutorial as written, on TF 2.21 / Keras 3.

Adam's slot variables are created lazily on the first ``apply_gradients`` call, which happens
inside the distributed ``tf.function`` step: "You must feed a value for placeholder tensor".
Fix: ``optimizer.build(model.trainable_variables)`` inside ``strategy.scope()``.
"""
import tensorflow as tf
import keras

from _common import data, mirrored, small_model

strategy = mirrored()
x, y = data()
ds = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(64))
with strategy.scope():
    model = small_model()
    optimizer = keras.optimizers.Adam()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


def step_fn(inputs):
    xb, yb = inputs
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(loss_fn(yb, model(xb, training=True)), global_batch_size=64)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function
def train_step(inputs):
    return strategy.reduce("SUM", strategy.run(step_fn, args=(inputs,)), axis=None)


for batch in ds:
    train_step(batch)

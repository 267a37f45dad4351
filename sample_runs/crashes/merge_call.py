"""Crash: a nested ``tf.function`` inside the replica function of ``strategy.run`` holds a
synchronization point (the optimizer's apply_gradients, which needs a cross-replica
``merge_call``): "merge_call called while defining a new graph or a tf.function"."""
import tensorflow as tf
import keras

from _common import data, mirrored, small_model

strategy = mirrored()
x, y = data()
ds = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(64))
with strategy.scope():
    model = small_model()
    optimizer = keras.optimizers.SGD()
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@tf.function
def apply(grads):  # a nested tf.function with a synchronization point inside
    optimizer.apply_gradients(zip(grads, model.trainable_variables))


def replica_step(inputs):
    xb, yb = inputs
    with tf.GradientTape() as tape:
        loss = loss_fn(yb, model(xb, training=True))
    apply(tape.gradient(loss, model.trainable_variables))
    return loss


@tf.function
def train_step(batch):
    return strategy.run(replica_step, args=(batch,))


for batch in ds:
    train_step(batch)

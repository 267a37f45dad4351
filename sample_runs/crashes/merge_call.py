"""Crash: ``strategy.run`` called eagerly with a ``tf.function`` whose body needs a cross-replica
``merge_call`` (the optimizer's apply_gradients): "merge_call called while defining a new graph"."""
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
def step_fn(inputs):
    xb, yb = inputs
    with tf.GradientTape() as tape:
        loss = loss_fn(yb, model(xb, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


for batch in ds:
    strategy.run(step_fn, args=(batch,))  # eager strategy.run of a tf.function

"""Crash: a tensor that does not fit (ResourceExhaustedError), after a few training steps.

The allocation asks for 2^40 float32 (4 TiB), which the allocator refuses at once without
touching memory, so the script fails fast and safely on any machine.
"""
import tensorflow as tf
import keras

from _common import data, mirrored, small_model

strategy = mirrored()
x, y = data()
with strategy.scope():
    model = small_model()
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=64, epochs=1, verbose=0)
with tf.device("/CPU:0"):
    activations = tf.zeros((1 << 20, 1 << 20), dtype=tf.float32)

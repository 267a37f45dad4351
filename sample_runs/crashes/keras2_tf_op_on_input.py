"""Crash: Keras 2 code on Keras 3 -- a TensorFlow op on a functional model's ``keras.Input``."""
import keras
import tensorflow as tf

from _common import data, mirrored

strategy = mirrored()
x, y = data()
with strategy.scope():
    inputs = keras.Input((8,))
    features = tf.expand_dims(inputs, -1)
    hidden = keras.layers.Flatten()(keras.layers.Conv1D(4, 3, padding="same")(features))
    model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=64, epochs=1, verbose=2)

"""Crash: Keras 2 code on Keras 3 -- a layer argument Keras 3 dropped (``BatchNormalization(fused=True)``)."""
import keras

from _common import data, mirrored

strategy = mirrored()
x, y = data()
with strategy.scope():
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(16),
        keras.layers.BatchNormalization(fused=True),
        keras.layers.Activation("relu"),
        keras.layers.Dense(2),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=64, epochs=1, verbose=2)

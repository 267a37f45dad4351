"""Crash: Keras 2 code on Keras 3 -- ``compile(metrics=AUC())``: Keras 3 wants a list of metrics."""
import keras

from _common import data, mirrored

strategy = mirrored()
x, y = data()
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=keras.metrics.AUC())
model.fit(x, y, batch_size=64, epochs=1, verbose=2)

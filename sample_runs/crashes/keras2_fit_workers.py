"""Crash: Keras 2 code on Keras 3 -- ``fit(workers=, use_multiprocessing=)`` are gone from ``fit``."""
import keras

from _common import data, mirrored, small_model

strategy = mirrored()
x, y = data()
with strategy.scope():
    model = small_model()
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=64, epochs=1, workers=4, use_multiprocessing=True, verbose=2)

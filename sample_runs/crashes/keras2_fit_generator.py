"""Crash: Keras 2 code on Keras 3 -- ``model.fit_generator`` is gone; ``fit`` takes the generator."""
import keras

from _common import data, mirrored, small_model

strategy = mirrored()
x, y = data()


def batches(batch_size=64):
    while True:
        for i in range(0, len(x), batch_size):
            yield x[i:i + batch_size], y[i:i + batch_size]


with strategy.scope():
    model = small_model()
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit_generator(batches(), steps_per_epoch=8, epochs=1, verbose=2)

"""Crash: Keras 2 code on Keras 3 -- ``Metric.reset_states()`` is ``reset_state()`` now."""
import keras

from _common import data, mirrored, small_model

strategy = mirrored()
x, y = data()
with strategy.scope():
    model = small_model()
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    metric = keras.metrics.Mean()
model.fit(x, y, batch_size=64, epochs=1, verbose=0)
metric.reset_states()

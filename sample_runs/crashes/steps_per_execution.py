"""Crash: Keras 3 ``fit`` with ``steps_per_execution > 1`` under MirroredStrategy
(keras-team/keras#19246); the same script works with ``steps_per_execution=1``."""
import keras

from _common import data, mirrored, small_model

strategy = mirrored()
x, y = data()
with strategy.scope():
    model = small_model()
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=4)
model.fit(x, y, batch_size=64, epochs=1, verbose=0)

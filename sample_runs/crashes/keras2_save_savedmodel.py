"""Crash: Keras 2 code on Keras 3 -- ``model.save(dir)`` wrote a SavedModel; Keras 3 wants a ``.keras`` file."""
import os
import tempfile

import keras

from _common import data, mirrored, small_model

out = tempfile.mkdtemp()
strategy = mirrored()
x, y = data()
with strategy.scope():
    model = small_model()
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=64, epochs=1, verbose=2)
model.save(os.path.join(out, "saved_model"))

"""Crash: Keras 2 code on Keras 3 -- ``ModelCheckpoint`` needs a path ending in ``.keras``."""
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
checkpoint = keras.callbacks.ModelCheckpoint(os.path.join(out, "model-{epoch:02d}"))
model.fit(x, y, batch_size=64, epochs=2, callbacks=[checkpoint], verbose=2)

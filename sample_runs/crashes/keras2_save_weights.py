"""Crash: Keras 2 code on Keras 3 -- ``save_weights`` needs a name ending in ``.weights.h5``."""
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
model.save_weights(os.path.join(out, "weights"))

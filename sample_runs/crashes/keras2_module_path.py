"""Crash: Keras 2 code on Keras 3 -- an import from a module Keras 3 does not have."""
import keras
from keras.utils.np_utils import to_categorical

from _common import data, mirrored, small_model

strategy = mirrored()
x, y = data()
with strategy.scope():
    model = small_model()
    model.compile(optimizer="adam", loss=keras.losses.CategoricalCrossentropy(from_logits=True))
model.fit(x, to_categorical(y, 2), batch_size=64, epochs=1, verbose=2)

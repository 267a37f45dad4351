"""Crash: Keras 2 code on Keras 3 -- ``keras.losses.Reduction.NONE`` is ``reduction=None`` now."""
import keras

from _common import mirrored, small_model

strategy = mirrored()
with strategy.scope():
    model = small_model()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=keras.losses.Reduction.NONE)

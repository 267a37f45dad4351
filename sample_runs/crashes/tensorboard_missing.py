"""Crash: the TensorBoard callback without the tensorboard package (TBNotInstalledError)."""
import keras

from _common import data, mirrored, small_model

strategy = mirrored()
x, y = data()
with strategy.scope():
    model = small_model()
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=64, epochs=1, verbose=0, callbacks=[keras.callbacks.TensorBoard("/tmp/tb-logs")])

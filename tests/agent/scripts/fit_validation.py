"""Keras fit with validation data under MirroredStrategy: Keras traces its test function (named
like its train function) at the first epoch end. Nothing retraces."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras
import numpy as np
import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
rng = np.random.default_rng(3)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int32")
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(x[:192], y[:192], batch_size=32, epochs=3, validation_data=(x[192:], y[192:]), verbose=2)
print("val_loss", history.history["val_loss"][-1])

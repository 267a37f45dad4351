"""Trains with ``import keras`` (Keras 3) even when TF_USE_LEGACY_KERAS=1 makes ``tf.keras`` the
legacy Keras 2 (a common mix while migrating; our own words). Prints the Keras that trained."""

import keras
import numpy as np

model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
model.fit(x, x.sum(axis=1, keepdims=True), batch_size=16, epochs=1, verbose=0)
print(f"trained with keras {keras.__version__}")

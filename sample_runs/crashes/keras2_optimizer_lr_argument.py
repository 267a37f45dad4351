"""Crash: Keras 2 code on Keras 3 -- ``Adam(lr=...)`` is ``Adam(learning_rate=...)`` now."""
import keras

from _common import data, mirrored, small_model

strategy = mirrored()
x, y = data()
with strategy.scope():
    model = small_model()
    optimizer = keras.optimizers.Adam(lr=1e-3)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=64, epochs=1, verbose=2)

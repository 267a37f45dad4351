"""Crash: Keras 2 code on Keras 3 -- ``keras.backend.set_value`` is gone; a variable has ``assign``."""
import keras

from _common import data, mirrored, small_model

strategy = mirrored()
x, y = data()
with strategy.scope():
    model = small_model()
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=64, epochs=1, verbose=2)
keras.backend.set_value(model.optimizer.learning_rate, 1e-4)  # fine-tune at a lower rate
model.fit(x, y, batch_size=64, epochs=1, verbose=2)

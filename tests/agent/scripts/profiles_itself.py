"""A Keras fit whose input waits (a sequential Python decode) and whose own callback starts the TF
profiler as soon as tpuwatch's automatic capture has begun: the script's profile must win."""
from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

OWN_LOGDIR = sys.argv[1]


def slow_decode(raw: np.ndarray) -> np.ndarray:
    time.sleep(0.0005)
    return raw.astype(np.float32) / 255.0


def decode(raw, label):
    x = tf.numpy_function(slow_decode, [raw], tf.float32)
    x.set_shape((16,))
    return x, label


class OwnProfile(keras.callbacks.Callback):
    """Starts the script's own capture once tpuwatch's has created its directory; stops it 3 batches later."""

    def __init__(self) -> None:
        super().__init__()
        self.started_at: int | None = None
        self.auto_dir = os.path.join(os.environ.get("TPUWATCH_RUN_DIR", "/nonexistent"), "profiles")

    def on_train_batch_end(self, batch, logs=None):
        if self.started_at is None and os.path.isdir(self.auto_dir):
            tf.profiler.experimental.start(OWN_LOGDIR)  # raises if another capture holds the profiler
            self.started_at = batch
            print("own profile started", flush=True)
        elif self.started_at is not None and batch == self.started_at + 3:
            tf.profiler.experimental.stop()
            print("own profile done", flush=True)


rng = np.random.default_rng(0)
raw = rng.integers(0, 256, (2048, 16), dtype=np.uint8)
labels = rng.integers(0, 2, 2048)
ds = tf.data.Dataset.from_tensor_slices((raw, labels)).repeat().map(decode).batch(32).prefetch(2)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(2)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(ds, epochs=1, steps_per_epoch=150, verbose=0, callbacks=[OwnProfile()])
print("trained", flush=True)

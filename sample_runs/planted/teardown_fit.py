"""Planted pause: TensorFlow's iterator teardown as ``model.fit`` returns.

``fit`` with ``steps_per_epoch`` keeps one iterator over the epochs and drops it as it returns.
The pipeline's parallel map is a ``tf.numpy_function`` (a Python decoder), and the batch after
the last one trained is slow to decode (``--pause-s``, default 3 s): the map has begun it when
``fit`` drops the iterator, whose deletion waits for it, the process idle. The training
thread's Python stack shows only Keras' frame and the script's ``fit`` line. Plain ``python``
pauses the same way.

It prints what it measured itself: ``planted fit_teardown_s=...``, from Keras'
``on_train_end`` to ``fit``'s return.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import numpy as np
import tensorflow as tf
import keras


class TrainEnd(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.t = 0.0

    def on_train_end(self, logs=None):
        self.t = time.perf_counter()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps-per-epoch", type=int, default=10)
    p.add_argument("--pause-s", type=float, default=3.0)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    slow_at = args.epochs * args.steps_per_epoch  # the batch after the last one trained
    rng = np.random.default_rng(0)
    x = rng.random((64 * (slow_at + 8), 8), dtype=np.float32)
    y = x.sum(axis=1, keepdims=True)

    def decode(index: np.ndarray, batch: np.ndarray) -> np.ndarray:
        time.sleep(args.pause_s if int(index) == slow_at else 0.002)  # that file is on a slow share
        return batch

    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(64).enumerate().map(
        lambda i, xy: (tf.ensure_shape(tf.numpy_function(decode, [i, xy[0]], tf.float32, stateful=True), (64, 8)),
                       xy[1]),
        num_parallel_calls=tf.data.AUTOTUNE)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    end = TrainEnd()
    model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=0, callbacks=[end], shuffle=False)
    print(f"planted fit_teardown_s={time.perf_counter() - end.t:.3f}", flush=True)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

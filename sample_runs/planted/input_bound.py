"""Planted problem: an input-bound Keras ``model.fit``. Rule that should fire: input-bound.

Each example goes through a Python "decoder" (``tf.numpy_function`` sleeping ``--decode-ms`` per
example, default 0.5 ms: about 64 ms for a 128-example global batch) in a sequential ``map`` with no
``num_parallel_calls`` and no explicit prefetch -- the classic slow pipeline. tf.data's own injected
prefetch overlaps it with the step, but the step (~15-30 ms of compute here) still waits most of
its time for input. Runs ``--epochs`` x ``--steps-per-epoch`` steps (default 3 x 25:
the rule wants 30 steady-state steps and 5 s of step time).
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
from training_setup import make_strategy, synthetic_mnist


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=25)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--batch-per-replica", type=int, default=32)
    p.add_argument("--decode-ms", type=float, default=0.5, help="Python decode time per example")
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    tf.random.set_seed(0)
    strategy = make_strategy(args.replicas)
    global_batch = args.batch_per_replica * strategy.num_replicas_in_sync
    delay_s = args.decode_ms / 1000.0

    def decode(image: np.ndarray) -> np.ndarray:
        time.sleep(delay_s)  # stands in for PIL/JPEG decoding in Python
        return image

    def parse(x, y):
        x = tf.numpy_function(decode, [x], tf.float32, stateful=True)
        x.set_shape([28, 28, 1])
        return x, y

    images, labels = synthetic_mnist(4096, seed=0)
    ds = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(4096, seed=0).repeat()
    ds = ds.map(parse).batch(global_batch, drop_remainder=True)  # planted: sequential map, no prefetch

    with strategy.scope():
        model = keras.Sequential([
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=2)
    print(f"done: {args.epochs * args.steps_per_epoch} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

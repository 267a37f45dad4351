"""Planted problem: a fit whose input pipeline blocks. Rule: stall, saying the input stopped.

A Keras ``fit`` reads its records through ``tf.data.Dataset.from_generator`` from a "record
server" (a queue another thread fills, as a reader fed by a download or a message queue is).
After record ``--block-at`` (default 1,600: batch 50) the server goes quiet for
``--block-seconds`` (default 30: well past the stall limit of a busy machine) before it sends
again: the generator waits in ``queue.get``, prefetch drains, and the step waits for its batch.
The stall finding says the input pipeline stopped, at the generator's line, not a hung
collective.
"""
from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import keras
import numpy as np
import tensorflow as tf


def record_server(out: queue.Queue, block_at: int, block_seconds: float) -> None:
    """Sends synthetic 28x28 records forever; goes quiet once, after ``block_at`` records."""
    rng = np.random.default_rng(0)
    sent = 0
    while True:
        if sent == block_at:
            time.sleep(block_seconds)  # the server stops answering for a while
        out.put((rng.random((28, 28, 1), dtype=np.float32), rng.integers(0, 10)))
        sent += 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--block-at", type=int, default=1600)
    p.add_argument("--block-seconds", type=float, default=30.0)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    records: queue.Queue = queue.Queue(maxsize=256)
    threading.Thread(target=record_server, args=(records, args.block_at, args.block_seconds), daemon=True).start()

    def from_server():
        while True:
            yield records.get(timeout=600)

    ds = tf.data.Dataset.from_generator(
        from_server, output_signature=(tf.TensorSpec((28, 28, 1), tf.float32), tf.TensorSpec((), tf.int64)))
    ds = ds.batch(32).prefetch(tf.data.AUTOTUNE)

    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, epochs=1, steps_per_epoch=args.steps, verbose=2)
    print(f"done: {args.steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Planted problem: an ``interleave`` over shards with ``cycle_length=1``. Rule: input-bound,
naming the interleave's line and the parallel read to ask for.

The training data is 32 shards (``.npy`` files written to a temporary directory first); fetching a
shard waits for latency before it reads, as an object in a storage bucket does (each shard's
dataset fetches it when iterated: a ``tf.numpy_function`` that sleeps, then ``np.load``).
``files.interleave(load_shard, cycle_length=1)`` fetches one shard at a time, so every batch of
the Keras ``fit`` waits for a fetch although the pipeline ends with ``prefetch``. The fix reads several shards at once:
``cycle_length=tf.data.AUTOTUNE, num_parallel_calls=tf.data.AUTOTUNE``.

The latency is sized to this machine (``fit``'s first eight steps timed with it off, by a
callback), because the fix's effect depends on it: where AUTOTUNE has two cores, two fetches at a
time hide the wait only if a fetch takes under two steps. Its sleep is ~1.3 of those steps;
measured (2026-11-30, load 2.0-2.6, TF 2.21 and 2.16): 26, 33, 30, 26 % input wait -> no finding
after the edit, 4 of 4. Sized from an eager pass timed before training (0.6x to 0.9x the compiled
step, by TensorFlow's version and the moment), a fetch came to 1.7-2.4 steps, and 50 % -> 31 %
in CI, as every other step waited for the next pair of fetches. With a fixed 40 ms the same
script was 43 % input-bound on one day's 2-core box and under 10 % on a slower day's.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import keras
import numpy as np
import tensorflow as tf
from training_setup import SizeByFirstSteps

FEATURES = 64
PER_SHARD = 64
LATENCY_S = 0.0  # set from fit's first steps (SizeByFirstSteps)


def write_shards(directory: str, shards: int) -> list[str]:
    rng = np.random.default_rng(0)
    paths = []
    for s in range(shards):
        path = os.path.join(directory, f"shard-{s:03d}.npy")
        np.save(path, rng.random((PER_SHARD, FEATURES), dtype=np.float32))
        paths.append(path)
    return paths


def fetch_shard(path: bytes) -> np.ndarray:
    if LATENCY_S:
        time.sleep(LATENCY_S)  # the storage service's latency before the first byte
    return np.load(path.decode())


def fetch(path):
    rows = tf.numpy_function(fetch_shard, [path], tf.float32)
    rows.set_shape((PER_SHARD, FEATURES))
    return rows, tf.cast(tf.reduce_sum(rows, axis=1) > FEATURES / 2, tf.int64)


def load_shard(path):
    # the shard's reader: it fetches when iterated, as TFRecordDataset(path) reads
    return tf.data.Dataset.from_tensors(path).map(fetch).unbatch()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--shards", type=int, default=32)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(2048, activation="relu"),
        keras.layers.Dense(2048, activation="relu"),
        keras.layers.Dense(2),
    ])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def size(step_s: float) -> None:
        global LATENCY_S
        LATENCY_S = 1.3 * step_s  # the fetch's sleep: ~1.3 steps

    with tempfile.TemporaryDirectory() as tmp:
        files = tf.data.Dataset.from_tensor_slices(write_shards(tmp, args.shards))
        ds = files.interleave(load_shard, cycle_length=1)
        ds = ds.batch(64).prefetch(tf.data.AUTOTUNE)

        model.compile(optimizer="adam", loss=loss)
        model.fit(ds, epochs=args.epochs, verbose=2, callbacks=[SizeByFirstSteps(size)])
    return 0


if __name__ == "__main__":
    sys.exit(main())

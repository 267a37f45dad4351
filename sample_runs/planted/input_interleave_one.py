"""Planted problem: an ``interleave`` over shards with ``cycle_length=1``. Rule: input-bound,
naming the interleave's line and the parallel read to ask for.

The training data is 32 shards (``.npy`` files written to a temporary directory first); fetching a
shard waits ~40 ms of latency before it reads, as an object in a storage bucket does (each
shard's dataset fetches it when iterated: a ``tf.numpy_function`` that sleeps, then ``np.load``).
``files.interleave(load_shard, cycle_length=1)`` fetches one shard at a time, so every batch of
the Keras ``fit`` waits for a fetch although the pipeline ends with ``prefetch``. The fix reads several shards at once:
``cycle_length=tf.data.AUTOTUNE, num_parallel_calls=tf.data.AUTOTUNE``.
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

FEATURES = 64
PER_SHARD = 64


def write_shards(directory: str, shards: int) -> list[str]:
    rng = np.random.default_rng(0)
    paths = []
    for s in range(shards):
        path = os.path.join(directory, f"shard-{s:03d}.npy")
        np.save(path, rng.random((PER_SHARD, FEATURES), dtype=np.float32))
        paths.append(path)
    return paths


def fetch_shard(path: bytes) -> np.ndarray:
    time.sleep(0.04)  # the storage service's latency before the first byte
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
    with tempfile.TemporaryDirectory() as tmp:
        files = tf.data.Dataset.from_tensor_slices(write_shards(tmp, args.shards))
        ds = files.interleave(load_shard, cycle_length=1)
        ds = ds.batch(64).prefetch(tf.data.AUTOTUNE)

        model = keras.Sequential([
            keras.Input((FEATURES,)),
            keras.layers.Dense(2048, activation="relu"),
            keras.layers.Dense(2048, activation="relu"),
            keras.layers.Dense(2),
        ])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(ds, epochs=args.epochs, verbose=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Planted problem: TFRecord files read one after another. Rule: input-bound, naming the
``TFRecordDataset`` line and its ``num_parallel_reads``.

The script first writes its training data as GZIP-compressed TFRecord shards to a temporary
directory (synthetic 128x128 images), then trains a Keras ``fit`` on
``tf.data.TFRecordDataset(files, compression_type="GZIP")``: without ``num_parallel_reads`` one
thread reads and inflates the shards in turn, slower than the step. The parse ``.map`` is already
parallel (it also keeps every fourth pixel, so the step's cost does not grow with what is read) and
the pipeline ends with ``prefetch``; the fix is ``num_parallel_reads=tf.data.AUTOTUNE`` (several
shards read and inflated at once).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide C++ INFO/WARNING chatter; errors still print

import keras
import numpy as np
import tensorflow as tf

SIDE = 128


def write_shards(directory: str, shards: int, per_shard: int) -> list[str]:
    rng = np.random.default_rng(0)
    files = []
    options = tf.io.TFRecordOptions(compression_type="GZIP")
    for s in range(shards):
        path = os.path.join(directory, f"train-{s:03d}.tfrecord.gz")
        with tf.io.TFRecordWriter(path, options) as writer:
            for _ in range(per_shard):
                label = int(rng.integers(0, 10))
                # smooth images with a little noise: they compress as photos do
                image = (np.linspace(0, 255, SIDE * SIDE * 3).reshape(SIDE, SIDE, 3) * (label + 1) / 10
                         + rng.integers(0, 8, (SIDE, SIDE, 3))).astype(np.uint8)
                example = tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                }))
                writer.write(example.SerializeToString())
        files.append(path)
    return files


def parse(record):
    features = tf.io.parse_single_example(record, {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    })
    image = tf.reshape(tf.io.decode_raw(features["image"], tf.uint8), (SIDE, SIDE, 3))
    return image[::4, ::4], features["label"]  # a cheap downscale to 32x32


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--per-shard", type=int, default=256)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        files = write_shards(tmp, args.shards, args.per_shard)

        ds = tf.data.TFRecordDataset(files, compression_type="GZIP")
        ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.batch(32).prefetch(tf.data.AUTOTUNE)

        model = keras.Sequential([
            keras.Input((SIDE // 4, SIDE // 4, 3), dtype="uint8"),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(16, 3, strides=2, activation="relu"),  # a light step: reading is the bottleneck
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(ds, epochs=args.epochs, verbose=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

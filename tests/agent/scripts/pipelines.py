"""Pipelines built the ways users build them, iterated by each kind of training loop.

Each stage's line ends with a ``# stage`` marker naming it: the test reads the markers to know
which line of this file made which stage.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf


def scale(x, y):
    return x / 2.0, y


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["fit", "fit_numpy", "custom", "from_function", "iterator_fn", "in_function", "plain",
                                      "eager_next", "progress", "peek"])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--autotune-off", action="store_true")
    args = p.parse_args()
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.default_rng(0)
    x = rng.random((256, 8), dtype=np.float32)
    y = rng.integers(0, 2, 256).astype(np.int64)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    def make(batch: int) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices((x, y))  # stage from_tensor_slices
        ds = ds.map(scale)  # stage map
        ds = ds.cache()  # stage cache
        ds = ds.shuffle(64)  # stage shuffle
        ds = ds.batch(batch, drop_remainder=True)  # stage batch
        ds = ds.prefetch(2)  # stage prefetch
        if args.autotune_off:
            options = tf.data.Options()
            options.autotune.enabled = False
            ds = ds.with_options(options)
        return ds

    def step_fn(inputs):
        xb, yb = inputs
        return tf.reduce_sum(model(xb))

    @tf.function
    def train_step(batch):
        return strategy.run(step_fn, args=(batch,))

    @tf.function
    def train_iter(iterator):
        return strategy.run(step_fn, args=(next(iterator),))

    if args.mode == "fit":
        model.fit(make(32), epochs=1, steps_per_epoch=args.steps, verbose=0)  # stage fit
    elif args.mode == "fit_numpy":
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)  # stage fit
    elif args.mode == "custom":
        dist = strategy.experimental_distribute_dataset(make(32))  # stage distribute
        for i, batch in enumerate(dist):  # loop custom
            train_step(batch)
            if i + 1 == args.steps:
                break
    elif args.mode == "from_function":
        def dataset_fn(ctx):
            return make(ctx.get_per_replica_batch_size(32))  # stage fn

        dist = strategy.distribute_datasets_from_function(dataset_fn)
        iterator = iter(dist)
        for _ in range(args.steps):
            train_iter(iterator)
    elif args.mode == "iterator_fn":
        iterator = iter(strategy.experimental_distribute_dataset(make(32).repeat()))  # stage repeat
        for _ in range(args.steps):
            train_iter(iterator)
    elif args.mode == "in_function":
        dist = strategy.experimental_distribute_dataset(make(32))  # stage distribute

        @tf.function
        def epoch():
            total = tf.constant(0.0)
            for batch in dist:  # iterated inside the graph
                total += strategy.reduce("SUM", strategy.run(step_fn, args=(batch,)), axis=None)
            return total

        epoch()
    elif args.mode == "eager_next":  # the iterator outside the tf.function, next() in Python
        iterator = iter(strategy.experimental_distribute_dataset(make(32)))  # stage distribute
        for _ in range(args.steps):
            train_step(next(iterator))  # loop eager_next
    elif args.mode == "peek":  # one look at a batch, then the fetches inside a tf.function
        ds = make(32)
        print("first batch:", next(iter(ds))[0].shape)

        @tf.function
        def plain_step(iterator):
            xb, _ = next(iterator)
            return tf.reduce_sum(model(xb))

        iterator = iter(ds)
        for _ in range(args.steps):
            plain_step(iterator)
    elif args.mode == "progress":  # a progress bar (an installed package) iterates for the loop
        folder = os.path.join(tempfile.mkdtemp(), "site-packages")
        os.makedirs(folder)
        with open(os.path.join(folder, "progress_bar.py"), "w") as f:
            f.write("def bar(items):\n    for item in items:\n        yield item\n")
        sys.path.insert(0, folder)
        import progress_bar

        for i, _ in enumerate(progress_bar.bar(make(32))):  # loop progress
            if i + 1 == args.steps:
                break
    else:
        for i, _ in enumerate(make(32)):  # loop plain
            if i + 1 == args.steps:
                break
    print("done")


if __name__ == "__main__":
    main()

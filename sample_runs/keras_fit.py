"""Train a small convnet on MNIST-shaped data with Keras ``model.fit`` under a distribution strategy.

This follows the TensorFlow guide "Use TPUs" (Keras fit under TPUStrategy): it connects to a TPU when
``TPUClusterResolver()`` resolves one, and otherwise runs MirroredStrategy over ``--replicas`` logical
CPU devices (or OneDeviceStrategy with ``--replicas 1``), so the same script runs on a laptop.

The data is synthetic (the box has no dataset downloads) but shaped like MNIST: 28x28x1 images,
10 classes, each class a fixed random pattern plus noise, so the model really learns. A share of
the labels is wrong (``--label-noise``, 20%), which keeps each replica's loss moving from batch to
batch in the first epochs. The wrong labels are fixed per example and the 2048 examples repeat
every epoch, so the model learns them too: over the default 15 epochs the loss still falls close to
zero and the accuracy reaches 1.00 (memorizing, not generalizing; it is a demo, not a benchmark).

By default it is a first run worth watching: 15 epochs of 100 steps (a few minutes on a laptop
CPU; stop it any time with ``q`` in the dashboard), and from step 600 on its input pipeline slows
down (``--slow-input-after``) so the dashboard has an ``input-bound`` finding to show. ``--short``
is the quick run (2 epochs of 5 steps, no planted slowdown).

Switches that plant problems on purpose:
  --slow-input-after N  from batch N on, each batch passes through a Python sleep of
                    ``--slow-input-ms`` (150 ms unless given). N defaults to 600 (in epoch 7 of
                    the full run); with --short or --slow-input there is no such slowdown; 0: never
  --slow-input      each batch passes through a Python sleep (``--slow-input-ms``, default 50 ms:
                    about twice the step's compute here),
                    with no prefetch and tf.data autotune/prefetch injection turned off, so every
                    training step waits for its input.
  --ragged-batches  the global batch size changes from epoch to epoch (a batch-size schedule with
                    static shapes), so Keras traces its train function again. Keras 3 traces
                    ``multi_step_on_iterator`` with ``reduce_retracing=True``, so this costs one
                    extra trace (the second shape relaxes the signature), not a storm.

Known limit: Keras 3.15 ``fit`` with ``steps_per_execution > 1`` fails under MirroredStrategy
(keras-team/keras#19246); use ``--replicas 1`` (OneDeviceStrategy) or a TPU for that.

    python sample_runs/keras_fit.py              # the first run: a few minutes
    python sample_runs/keras_fit.py --short      # 10 steps
    python sample_runs/keras_fit.py --epochs 3 --steps-per-epoch 50
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

IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--short", action="store_true",
                   help="the quick run: 2 epochs of 5 steps and no planted slowdown (default: 15 x 100 steps)")
    p.add_argument("--epochs", type=int, default=None, help="default 15 (2 with --short)")
    p.add_argument("--steps-per-epoch", type=int, default=None, help="default 100 (5 with --short)")
    p.add_argument("--replicas", type=int, default=4, help="logical CPU devices when there is no TPU")
    p.add_argument("--batch-per-replica", type=int, default=32, help="the TPU guide uses 128 per core")
    p.add_argument("--steps-per-execution", type=int, default=1)
    p.add_argument("--slow-input", action="store_true", help="plant: a sleeping, unprefetched input pipeline")
    p.add_argument("--slow-input-ms", type=float, default=None,
                   help="the planted input sleep per batch (default 50; 150 for --slow-input-after)")
    p.add_argument("--slow-input-after", type=int, default=None, metavar="N",
                   help="plant: from batch N on, every batch sleeps --slow-input-ms (default 600; off with "
                        "--short; 0: never)")
    p.add_argument("--label-noise", type=float, default=0.2,
                   help="share of wrong labels, fixed per example (default 0.2; the model learns them too in the "
                        "end)")
    p.add_argument("--ragged-batches", action="store_true", help="plant: the batch size changes every epoch")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    if args.epochs is None:
        args.epochs = 2 if args.short else 15
    if args.steps_per_epoch is None:
        args.steps_per_epoch = 5 if args.short else 100
    if args.slow_input_after is None:
        args.slow_input_after = 0 if args.short or args.slow_input else 600
    if args.slow_input_ms is None:
        args.slow_input_ms = 50.0 if args.slow_input else 150.0
    if not 0.0 <= args.label_noise < 1.0:
        p.error("--label-noise must be in [0, 1)")
    for name in ("epochs", "steps_per_epoch", "replicas", "batch_per_replica", "steps_per_execution"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def make_strategy(replicas: int) -> tf.distribute.Strategy:
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
    except ValueError:  # "Please provide a TPU Name to connect to." -- no TPU here
        resolver = None
    if resolver is not None:
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if tf.config.list_physical_devices("GPU"):
        return tf.distribute.MirroredStrategy()
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    if replicas == 1:
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    return tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])


def synthetic_mnist(n: int, seed: int, label_noise: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    templates = rng.random((NUM_CLASSES, *IMAGE_SHAPE), dtype=np.float32)
    labels = rng.integers(0, NUM_CLASSES, n)
    noise = rng.random((n, *IMAGE_SHAPE), dtype=np.float32)
    images = (0.5 * templates[labels] + 0.5 * noise).astype(np.float32)
    wrong = rng.random(n) < label_noise
    labels = np.where(wrong, rng.integers(0, NUM_CLASSES, n), labels)
    return images, labels.astype(np.int64)


class LateSleep:
    """Sleeps on every call from the ``after``-th on: an input pipeline that slows down mid-run."""

    def __init__(self, after: int, delay_s: float) -> None:
        self.after = after
        self.delay_s = delay_s
        self.calls = 0

    def __call__(self, images: np.ndarray) -> np.ndarray:
        self.calls += 1
        if self.calls > self.after:
            time.sleep(self.delay_s)
        return images


def sleepy(images: np.ndarray, delay_s: float) -> np.ndarray:
    time.sleep(delay_s)  # stands in for slow decoding / reading from a slow disk
    return images


def make_dataset(images, labels, global_batch: int, args: argparse.Namespace) -> tf.data.Dataset:
    ds = tf.data.Dataset.from_tensor_slices((images, labels)).cache()
    ds = ds.shuffle(len(images), seed=args.seed).repeat()
    ds = ds.batch(global_batch, drop_remainder=True)
    if args.slow_input_after and not args.slow_input:
        late = LateSleep(args.slow_input_after, args.slow_input_ms / 1000.0)

        def late_slow(x, y):
            x = tf.numpy_function(late, [x], tf.float32, stateful=True)
            x.set_shape([global_batch, *IMAGE_SHAPE])
            return x, y

        options = tf.data.Options()
        # Else tf.data's autotuning parallelises the map after a while and the slowdown vanishes.
        options.experimental_optimization.map_parallelization = False
        options.autotune.enabled = False
        return ds.map(late_slow).prefetch(2).with_options(options)
    if not args.slow_input:
        return ds.prefetch(tf.data.AUTOTUNE)

    delay_s = args.slow_input_ms / 1000.0

    def slow(x, y):
        x = tf.numpy_function(lambda a: sleepy(a, delay_s), [x], tf.float32, stateful=True)
        x.set_shape([global_batch, *IMAGE_SHAPE])
        return x, y

    ds = ds.map(slow)  # sequential, and no prefetch after it
    options = tf.data.Options()
    # tf.data would otherwise inject a prefetch and autotune, hiding part of the sleep.
    options.experimental_optimization.inject_prefetch = False
    options.experimental_optimization.map_parallelization = False
    options.autotune.enabled = False
    return ds.with_options(options)


def make_model() -> keras.Model:
    return keras.Sequential([
        keras.Input(IMAGE_SHAPE),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(NUM_CLASSES),
    ])


class StepTimer(keras.callbacks.Callback):
    """Wall time per training step, from each call of the train function.

    Keras calls back once per execution: ``batch`` is its first step at the beginning and its last
    step at the end, so one call covers ``end - begin + 1`` steps.
    """

    def __init__(self) -> None:
        super().__init__()
        self.per_step_s: list[float] = []
        self.steps = 0
        self._t0 = 0.0
        self._begin = 0

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = batch
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        n = batch - self._begin + 1
        self.steps += n
        self.per_step_s.append((time.perf_counter() - self._t0) / n)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tf.random.set_seed(args.seed)
    keras.utils.set_random_seed(args.seed)
    strategy = make_strategy(args.replicas)
    replicas = strategy.num_replicas_in_sync
    if args.steps_per_execution > 1 and isinstance(strategy, tf.distribute.MirroredStrategy):
        print("keras_fit.py: --steps-per-execution > 1 fails under MirroredStrategy in Keras 3.15 "
              "(keras-team/keras#19246); use --replicas 1 or a TPU", file=sys.stderr)
        return 2
    global_batch = args.batch_per_replica * replicas
    print(f"strategy: {type(strategy).__name__}, {replicas} replicas, global batch {global_batch}")

    with strategy.scope():
        model = make_model()
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["sparse_categorical_accuracy"],
            steps_per_execution=args.steps_per_execution,
        )

    images, labels = synthetic_mnist(max(8 * global_batch, 2048), args.seed, args.label_noise)
    if args.slow_input_after and not args.slow_input:
        print(f"planted: from batch {args.slow_input_after} on the input pipeline sleeps "
              f"{args.slow_input_ms:.0f} ms per batch (watch for the input-bound finding; "
              f"--slow-input-after 0 turns it off, --short is the quick run)")
    timer = StepTimer()
    if args.ragged_batches:
        # A batch-size schedule: each epoch a fresh dataset with a different static batch size.
        for epoch in range(args.epochs):
            batch = global_batch if epoch % 2 == 0 else global_batch // 2 + replicas
            print(f"epoch {epoch + 1}: global batch {batch}")
            ds = make_dataset(images, labels, batch, args)
            model.fit(ds, initial_epoch=epoch, epochs=epoch + 1, steps_per_epoch=args.steps_per_epoch,
                      callbacks=[timer], verbose=2)
    else:
        ds = make_dataset(images, labels, global_batch, args)
        model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, callbacks=[timer], verbose=2)

    median_ms = 1000.0 * float(np.median(timer.per_step_s[1:] or timer.per_step_s))
    print(f"done: {timer.steps} steps, median {median_ms:.1f} ms/step (the first call, with tracing, left out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Train a small convnet on MNIST-shaped data with a custom training loop under a distribution strategy.

This follows the TensorFlow guide "Custom training with tf.distribute.Strategy": a ``@tf.function``
train step calls ``strategy.run`` (one call per replica) and ``strategy.reduce``. It connects to a
TPU when ``TPUClusterResolver()`` resolves one, and otherwise runs MirroredStrategy over
``--replicas`` logical CPU devices (OneDeviceStrategy with ``--replicas 1``).

Two ways to feed the step:
  default                   ``for x in dist_dataset: train_step(x)`` -- one step per call.
  --iterator-in-function    the tf.function takes the distributed iterator and calls ``next`` inside;
                            with ``--steps-per-call k`` it runs k steps per call in a ``tf.range``
                            loop (the TPU guide's way to cut host round trips).

The loss it reports: each replica returns the mean loss of its own examples, and
``strategy.reduce(MEAN, per_replica_loss)`` averages those, so the reduced loss is exactly the mean
of the per-replica values (with uneven batches that is not the mean over all examples). The
gradient uses ``tf.nn.compute_average_loss`` (scaled by the global batch), as the guide says.
``--loss-log PATH`` writes one line per training step, ``step,reduced_loss`` (1-based step, the
loss as Python's ``repr`` of the float), for comparison with per-replica losses seen elsewhere.

Switches that plant problems on purpose:
  --slow-input      each batch passes through a Python sleep (``--slow-input-ms``, default 50 ms),
                    no prefetch, tf.data autotune and prefetch injection off: steps wait for input.
  --ragged-batches  batches are bucketed with a different batch size per bucket (tf.data
                    ``group_by_window``, as ``bucket_by_sequence_length`` does), so the step function
                    sees several batch shapes and retraces once per new shape (the default loop;
                    with --iterator-in-function the iterator's shape is already unknown: no retrace).

    python sample_runs/custom_loop.py --steps 200 --loss-log /tmp/loss.csv
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
    p.add_argument("--steps", type=int, default=20, help="training steps in all")
    p.add_argument("--replicas", type=int, default=4, help="logical CPU devices when there is no TPU")
    p.add_argument("--batch-per-replica", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--iterator-in-function", action="store_true", help="call next(iterator) inside the tf.function")
    p.add_argument("--steps-per-call", type=int, default=1, help="steps per tf.function call (needs --iterator-in-function)")
    p.add_argument("--loss-log", metavar="PATH", help="write 'step,reduced_loss' per step to PATH")
    p.add_argument("--log-every", type=int, default=1, help="print the loss every N steps")
    p.add_argument("--slow-input", action="store_true", help="plant: a sleeping, unprefetched input pipeline")
    p.add_argument("--slow-input-ms", type=float, default=50.0)
    p.add_argument("--ragged-batches", action="store_true", help="plant: several batch sizes, one retrace each")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    for name in ("steps", "replicas", "batch_per_replica", "steps_per_call", "log_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.steps_per_call > 1 and not args.iterator_in_function:
        p.error("--steps-per-call > 1 needs --iterator-in-function")
    if args.steps % args.steps_per_call:
        p.error("--steps must be a multiple of --steps-per-call")
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


def synthetic_mnist(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    templates = rng.random((NUM_CLASSES, *IMAGE_SHAPE), dtype=np.float32)
    labels = rng.integers(0, NUM_CLASSES, n)
    noise = rng.random((n, *IMAGE_SHAPE), dtype=np.float32)
    return (0.5 * templates[labels] + 0.5 * noise).astype(np.float32), labels.astype(np.int64)


def sleepy(images: np.ndarray, delay_s: float) -> np.ndarray:
    time.sleep(delay_s)  # stands in for slow decoding / reading from a slow disk
    return images


def make_dataset(global_batch: int, replicas: int, args: argparse.Namespace) -> tf.data.Dataset:
    images, labels = synthetic_mnist(max(8 * global_batch, 2048), args.seed)
    ds = tf.data.Dataset.from_tensor_slices((images, labels)).cache()
    ds = ds.shuffle(len(images), seed=args.seed).repeat()
    # Per-example preprocessing, run in parallel as the tf.data performance guide recommends.
    ds = ds.map(lambda x, y: (tf.image.per_image_standardization(x), y), num_parallel_calls=tf.data.AUTOTUNE)
    if args.ragged_batches:
        # Four buckets, each batched at its own size (all multiples of the replica count).
        sizes = tf.constant([global_batch * k // 4 // replicas * replicas or replicas for k in (4, 3, 2, 1)],
                            tf.int64)
        ds = ds.enumerate().group_by_window(
            key_func=lambda i, xy: tf.random.stateless_uniform([], [args.seed, i], 0, 4, tf.int64),
            reduce_func=lambda key, window: window.batch(sizes[key]),
            window_size_func=lambda key: sizes[key],
        ).map(lambda i, xy: xy)
    else:
        ds = ds.batch(global_batch, drop_remainder=True)
    if not args.slow_input:
        return ds.prefetch(tf.data.AUTOTUNE)

    delay_s = args.slow_input_ms / 1000.0

    def slow(x, y):
        slowed = tf.numpy_function(lambda a: sleepy(a, delay_s), [x], tf.float32, stateful=True)
        slowed.set_shape(x.shape)
        return slowed, y

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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tf.random.set_seed(args.seed)
    keras.utils.set_random_seed(args.seed)
    strategy = make_strategy(args.replicas)
    replicas = strategy.num_replicas_in_sync
    global_batch = args.batch_per_replica * replicas
    print(f"strategy: {type(strategy).__name__}, {replicas} replicas, global batch {global_batch}")

    with strategy.scope():
        model = make_model()
        optimizer = keras.optimizers.Adam(args.learning_rate)
        # Create the optimizer's slots now: created on the first traced step, under MirroredStrategy
        # they make TF 2.21 lift the step into a cond that fails to run.
        optimizer.build(model.trainable_variables)
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def step_fn(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_example = loss_object(labels, logits)
            scaled = tf.nn.compute_average_loss(per_example)  # / global batch: the all-reduce sums grads
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.reduce_mean(per_example)  # this replica's mean loss

    @tf.function
    def train_step(batch):
        # A PerReplica batch has no single shape: count each replica's examples inside strategy.run.
        images, labels = batch
        per_replica_loss, per_replica_n = strategy.run(
            lambda x, y: (step_fn(x, y), tf.shape(y)[0]), args=(images, labels))
        loss = strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica_loss, axis=None)
        examples = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_n, axis=None)
        return tf.reshape(loss, [1]), tf.reshape(examples, [1])

    k = args.steps_per_call

    @tf.function
    def train_steps(iterator):
        losses = tf.TensorArray(tf.float32, size=k)
        examples = tf.TensorArray(tf.int32, size=k)
        for i in tf.range(k):
            images, labels = next(iterator)
            per_replica_loss, per_replica_n = strategy.run(
                lambda x, y: (step_fn(x, y), tf.shape(y)[0]), args=(images, labels))
            losses = losses.write(i, strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica_loss, axis=None))
            examples = examples.write(i, strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_n, axis=None))
        return losses.stack(), examples.stack()

    dist_dataset = strategy.experimental_distribute_dataset(make_dataset(global_batch, replicas, args))
    loss_log = open(args.loss_log, "w") if args.loss_log else None
    step = 0
    batch_sizes: set[int] = set()
    per_step_s: list[float] = []
    t_start = t_call = time.perf_counter()
    try:
        if args.iterator_in_function:
            iterator = iter(dist_dataset)
            calls = (train_steps(iterator) for _ in range(args.steps // k))
        else:
            calls = (train_step(batch) for _, batch in zip(range(args.steps), dist_dataset))  # no extra fetch
        for losses, examples in calls:
            losses, examples = losses.numpy(), examples.numpy()  # waits for the call to finish
            now = time.perf_counter()
            per_step_s.append((now - t_call) / k)  # includes fetching the batch in the default loop
            t_call = now
            for loss, n in zip(losses.tolist(), examples.tolist()):
                step += 1
                batch_sizes.add(n)
                if loss_log:
                    loss_log.write(f"{step},{loss!r}\n")
                if step % args.log_every == 0 or step == args.steps:
                    print(f"step {step:5d}  batch {n:4d}  loss {loss:.4f}", flush=True)
    finally:
        if loss_log:
            loss_log.close()
    elapsed = time.perf_counter() - t_start
    traces = (train_steps if args.iterator_in_function else train_step).experimental_get_tracing_count()
    median_ms = 1000.0 * float(np.median(per_step_s[1:] or per_step_s))
    print(f"done: {step} steps in {elapsed:.2f} s, median {median_ms:.1f} ms/step (first call left out), "
          f"batch sizes {sorted(batch_sizes)}, step function traced {traces} time(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

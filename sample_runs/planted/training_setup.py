"""What the planted scripts share and no finding is about: a strategy over this machine's
devices and an MNIST-shaped synthetic data set (no downloads). Each planted script keeps in its
own lines what its finding names (the pipeline, the tf.function, the training loop), so the
file:line a finding quotes is the script's.

Imported as ``from training_setup import ...``: ``python sample_runs/planted/x.py`` and
``tpuwatch run sample_runs/planted/x.py`` both put the script's folder first on ``sys.path``.
"""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf


def make_strategy(replicas: int) -> tf.distribute.Strategy:
    """TPUStrategy when a TPU resolves, else MirroredStrategy over ``replicas`` logical CPUs."""
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
    except ValueError:  # no TPU here
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
        return tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def synthetic_mnist(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` 28x28x1 float32 images (each a class template plus noise, so a model can learn
    them) and their int64 labels."""
    rng = np.random.default_rng(seed)
    templates = rng.random((10, 28, 28, 1), dtype=np.float32)
    labels = rng.integers(0, 10, n)
    noise = rng.random((n, 28, 28, 1), dtype=np.float32)
    return (0.5 * templates[labels] + 0.5 * noise).astype(np.float32), labels.astype(np.int64)


def eager_step_seconds(model, x: np.ndarray, y: np.ndarray, loss_fn) -> float:
    """The model's forward and backward pass on one batch, run eagerly (the fastest of three after
    a warm-up): a measure of this machine's speed at this model, taken before training starts and
    outside any tf.function. On CPU it takes about the compiled step's time for dense layers, ~1.3x
    for convolutions."""
    best = float("inf")
    for i in range(4):
        start = time.perf_counter()
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape.gradient(loss, model.trainable_variables)
        if i:
            best = min(best, time.perf_counter() - start)
    return best

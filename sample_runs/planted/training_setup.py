"""What the planted scripts share and no finding is about: a strategy over this machine's
devices, an MNIST-shaped synthetic data set (no downloads) and a callback that sizes a planted
wait by the training's first steps. Each planted script keeps in its
own lines what its finding names (the pipeline, the tf.function, the training loop), so the
file:line a finding quotes is the script's.

Imported as ``from training_setup import ...``: ``python sample_runs/planted/x.py`` and
``tpuwatch run sample_runs/planted/x.py`` both put the script's folder first on ``sys.path``.
"""

from __future__ import annotations

import time

import keras
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


class SizeByFirstSteps(keras.callbacks.Callback):
    """Calls ``size(step_s)`` once, with the median time between the ends of ``fit``'s first
    ``steps`` batches (after the first, which traces): the compiled step on this machine, under
    this load and this TensorFlow, with the planted wait still off. A wait sized to it holds its
    ratio to the step where an eager pass timed before training was 0.6x to 0.9x the compiled step,
    by TensorFlow's version and the moment."""

    def __init__(self, size, steps: int = 8) -> None:
        super().__init__()
        if steps < 3:
            raise ValueError(f"steps={steps}: the first traces, so at least 3 are needed")
        self._size = size
        self._steps = steps
        self._ends: list[float] = []

    def on_train_batch_end(self, batch, logs=None) -> None:
        if len(self._ends) >= self._steps:
            return
        self._ends.append(time.perf_counter())
        if len(self._ends) == self._steps:
            gaps = sorted(b - a for a, b in zip(self._ends, self._ends[1:]))
            self._size(gaps[len(gaps) // 2])

    def on_train_end(self, logs=None) -> None:
        if len(self._ends) < self._steps:
            print(f"planted: fit ran {len(self._ends)} steps, under the {self._steps} that size its "
                  "wait; nothing was planted", flush=True)

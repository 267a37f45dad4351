"""Shared setup for the crash scripts: four logical CPU devices under MirroredStrategy."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
import keras


def mirrored(replicas: int = 4) -> tf.distribute.Strategy:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    return tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])


def data(n: int = 512) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random((n, 8), dtype=np.float32), rng.integers(0, 2, n).astype(np.int64)


def small_model() -> keras.Model:
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])

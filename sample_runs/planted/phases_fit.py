"""Planted phases: a Keras ``model.fit`` whose wall time goes to known places (goodput ledger).

Written the way fit scripts usually are: a Sequential model compiled under MirroredStrategy,
``validation_data`` with ``validation_freq``, and callbacks. Planted amounts:

- ``--sleep-before-s`` (default 3): Python sleeps before fit ("downloading the data set");
- ``--callback-sleep-s`` (default 1): a callback sleeps at every epoch end (slow logging);
- ``--val-batch-s`` x ``--val-batches`` (default 0.3 s x 40 = 12 s): the validation pipeline
  sleeps per batch; validation runs after epoch 2 only (``validation_freq=2``), so between
  epochs 2 and 3 there is no step for longer than the stall rule's 10 s limit;
- a callback saves the weights at every epoch end (``model.save_weights``).

It prints what it measured itself, one line each: ``planted sleep_before_s=...``, and at the
end ``planted callback_sleep_s=...``, ``planted evaluating_s=...`` (on_test_begin to
on_test_end, summed), ``planted checkpointing_s=...`` (the saves, summed),
``planted between_steps_s=...`` (from each training batch's end to the next one's beginning,
summed: the callbacks, the validation, the saves and whatever Keras does between), so a test compares
tpuwatch's ledger with the script's own clock.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
import keras


class SlowLogger(keras.callbacks.Callback):
    """Stands for a callback that ships metrics somewhere slow at every epoch end."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.total = 0.0

    def on_epoch_end(self, epoch, logs=None):
        t = time.perf_counter()
        time.sleep(self.seconds)
        self.total += time.perf_counter() - t


class SaveEveryEpoch(keras.callbacks.Callback):
    def __init__(self, directory: str) -> None:
        super().__init__()
        self.directory = directory
        self.total = 0.0

    def on_epoch_end(self, epoch, logs=None):
        t = time.perf_counter()
        self.model.save_weights(os.path.join(self.directory, f"epoch{epoch + 1}.weights.h5"))
        self.total += time.perf_counter() - t


class BatchGaps(keras.callbacks.Callback):
    """Wall time between one training batch's end and the next one's beginning, summed."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0.0
        self._end: float | None = None

    def on_train_batch_begin(self, batch, logs=None):
        if self._end is not None:
            self.total += time.perf_counter() - self._end

    def on_train_batch_end(self, batch, logs=None):
        self._end = time.perf_counter()


class EvalTimer(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.total = 0.0
        self._t = 0.0

    def on_test_begin(self, logs=None):
        self._t = time.perf_counter()

    def on_test_end(self, logs=None):
        self.total += time.perf_counter() - self._t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=20)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--sleep-before-s", type=float, default=3.0)
    p.add_argument("--callback-sleep-s", type=float, default=1.0)
    p.add_argument("--val-batch-s", type=float, default=0.3)
    p.add_argument("--val-batches", type=int, default=40)
    args = p.parse_args()
    keras.utils.set_random_seed(0)
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)
    strategy = tf.distribute.MirroredStrategy()
    batch = 16 * strategy.num_replicas_in_sync

    t0 = time.perf_counter()
    time.sleep(args.sleep_before_s)
    print(f"planted sleep_before_s={time.perf_counter() - t0:.3f}", flush=True)

    rng = np.random.default_rng(0)
    x = rng.random((batch * args.steps_per_epoch, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, len(x))
    train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x)).batch(batch).repeat().prefetch(2)

    def slow_read(images):
        time.sleep(args.val_batch_s)  # a validation set read from a slow network share
        return images

    def slow(images, labels):
        images = tf.numpy_function(slow_read, [images], tf.float32, stateful=True)
        images.set_shape([None, 28, 28, 1])
        return images, labels

    vx = rng.random((batch * args.val_batches, 28, 28, 1), dtype=np.float32)
    vy = rng.integers(0, 10, len(vx))
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    options.autotune.enabled = False
    val = tf.data.Dataset.from_tensor_slices((vx, vy)).batch(batch).map(slow).with_options(options)

    with strategy.scope():
        model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                                  keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    logger, saver, evals = SlowLogger(args.callback_sleep_s), SaveEveryEpoch(tempfile.mkdtemp()), EvalTimer()
    gaps = BatchGaps()
    model.fit(train, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, validation_data=val,
              validation_freq=2, callbacks=[gaps, logger, saver, evals], verbose=2)
    print(f"planted callback_sleep_s={logger.total:.3f}", flush=True)
    print(f"planted evaluating_s={evals.total:.3f}", flush=True)
    print(f"planted checkpointing_s={saver.total:.3f}", flush=True)
    print(f"planted between_steps_s={gaps.total:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

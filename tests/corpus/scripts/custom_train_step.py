"""``fit`` with an overridden ``train_step``, in the shape of Keras' "Customizing what happens in
fit()" guide (our own words, synthetic data), under MirroredStrategy with ``--replicas N``.

Keras 3: the step calls ``self.compute_loss`` and applies the gradients itself; with ``--mixed``
the policy is ``mixed_float16``, the optimizer a ``LossScaleOptimizer``, and the gradient is taken
of ``self.optimizer.scale_loss(loss)``. tf_keras (``TF_USE_LEGACY_KERAS=1``): the step calls
``self.compiled_loss`` (which divides the loss by the replicas in sync for the gradient) and
``self.optimizer.minimize``. Both update the compiled loss metric with the step's loss.

Prints Keras' logged (running mean) loss after every batch:
``epoch E batch B running_loss X``.
"""

import argparse
import os

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--replicas", type=int, default=2)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--mixed", action="store_true")
a = p.parse_args()

legacy = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
if legacy:
    import tf_keras as keras
else:
    import keras

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
strategy = tf.distribute.MirroredStrategy()
keras.utils.set_random_seed(11)
if a.mixed:
    keras.mixed_precision.set_global_policy("mixed_float16")


class StepModel(keras.Model):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            if legacy:
                loss = self.compiled_loss(y, y_pred, regularization_losses=self.losses)
            else:
                loss = self.compute_loss(y=y, y_pred=y_pred)
                target = self.optimizer.scale_loss(loss) if a.mixed else loss
        if legacy:
            self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
            self.compiled_metrics.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}
        self.optimizer.apply(tape.gradient(target, self.trainable_variables), self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


with strategy.scope():
    inputs = keras.Input((16,))
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    outputs = keras.layers.Dense(1, dtype="float32")(hidden)
    model = StepModel(inputs, outputs)
    optimizer = keras.optimizers.Adam(0.01)
    if a.mixed:
        # Not the default 2**15: Keras 3.0-3.6 check each replica's gradients for overflow before
        # they are summed, so a first step that overflows on some replicas only is applied there and
        # the weights (the script's own loss) go NaN. 2**8 overflows nowhere and is still far from 1.
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer, initial_scale=2.0**8)
    model.compile(optimizer=optimizer, loss="mse", metrics=["mae"])

batch = 16 * a.replicas
rng = np.random.default_rng(5)
x = rng.normal(size=(batch * a.steps, 16)).astype("float32")
y = (x[:, :1] * 2.0 + rng.normal(scale=0.1, size=(batch * a.steps, 1))).astype("float32")


class PrintLoss(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        print(f"epoch {self.epoch + 1} batch {batch + 1} running_loss {float(logs['loss'])!r}", flush=True)


model.fit(x, y, batch_size=batch, epochs=a.epochs, shuffle=False, verbose=0, callbacks=[PrintLoss()])

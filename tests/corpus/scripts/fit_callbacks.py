"""Keras ``fit`` under MirroredStrategy with validation data and the usual callbacks (the shape of
the "Distributed training with Keras" tutorial; our own words): ModelCheckpoint,
LearningRateScheduler, and a callback that prints the learning rate and each batch's logs.
Prints ``epoch E batch B running_loss X`` (Keras logs the running mean of the epoch's loss).
Then evaluates the model (``--reload``: a copy reloaded from disk outside the strategy's scope,
and predicts with it).
"""

import argparse
import os

import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--replicas", type=int, default=4)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--steps", type=int, default=5, help="training batches per epoch")
p.add_argument("--reload", action="store_true")
p.add_argument("--steps-per-execution", type=int, default=1)
p.add_argument("--run-functions-eagerly", action="store_true", help="tf.config.run_functions_eagerly(True)")
a = p.parse_args()
if a.run_functions_eagerly:
    tf.config.run_functions_eagerly(True)

if a.replicas > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
    strategy = tf.distribute.MirroredStrategy()
else:
    strategy = tf.distribute.get_strategy()
BATCH = 8 * strategy.num_replicas_in_sync

images = tf.random.uniform([BATCH * a.steps, 28, 28, 1], seed=11)
labels = tf.random.uniform([BATCH * a.steps], maxval=10, dtype=tf.int64, seed=12)
train = tf.data.Dataset.from_tensor_slices((images, labels)).batch(BATCH, drop_remainder=True)
val = tf.data.Dataset.from_tensor_slices((images[: BATCH * 3], labels[: BATCH * 3])).batch(BATCH)

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.Adam(), metrics=["accuracy"],
                  steps_per_execution=a.steps_per_execution)


def decay(epoch):
    return 1e-3 if epoch < 1 else 1e-4


class PrintProgress(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        print(f"epoch {self.epoch + 1} batch {batch + 1} running_loss {float(logs['loss'])!r}")

    def on_epoch_end(self, epoch, logs=None):
        lr = self.model.optimizer.learning_rate
        print(f"Learning rate for epoch {epoch + 1} is {float(lr.numpy() if hasattr(lr, 'numpy') else lr)}")


checkpoint_prefix = os.path.join(os.getcwd(), "training_checkpoints", "ckpt_{epoch}.weights.h5")
callbacks = [
    tf.keras.callbacks.ModelCheckpoint(filepath=checkpoint_prefix, save_weights_only=True),
    tf.keras.callbacks.LearningRateScheduler(decay),
    PrintProgress(),
]
model.fit(train, epochs=a.epochs, validation_data=val, callbacks=callbacks, verbose=0)
eval_loss, eval_acc = model.evaluate(val, verbose=0)
print(f"Eval loss: {eval_loss}, Eval accuracy: {eval_acc}")

if a.reload:
    path = os.path.join(os.getcwd(), "saved_model.keras")
    model.save(path)
    unreplicated = tf.keras.models.load_model(path)
    unreplicated.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    loss, acc = unreplicated.evaluate(val, verbose=0)
    print(f"Reloaded eval loss: {loss}, accuracy: {acc}")
    print("predictions", unreplicated.predict(val, verbose=0).shape)

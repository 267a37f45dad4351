"""Keras fit running several steps a call (``steps_per_execution``) on one device, over a finite
dataset of batches of a fixed size: Keras fetches each next batch inside its loop with
``get_next_as_optional``. Prints the optimizer's iterations at the end: the steps that trained."""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--steps-per-execution", type=int, default=4)
p.add_argument("--batches", type=int, default=10, help="batches of 8 in the dataset (one epoch)")
p.add_argument("--epochs", type=int, default=2)
a = p.parse_args()

features = tf.random.normal([8 * a.batches, 16], seed=3)
targets = tf.random.normal([8 * a.batches, 1], seed=4)
data = tf.data.Dataset.from_tensor_slices((features, targets)).batch(8, drop_remainder=True)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", steps_per_execution=a.steps_per_execution)
model.fit(data, epochs=a.epochs, verbose=0)
print(f"trained {int(model.optimizer.iterations.numpy())} steps")

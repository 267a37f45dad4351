"""An eager training loop with no tf.function at all, in the shape of TensorFlow's "Custom
training: walkthrough" and the first part of Keras' "Writing a training loop from scratch" (our
own words, synthetic penguin-like data: 4 features, 3 classes).

``--shape walkthrough``  a ``grad()`` helper returns (loss, gradients); ``apply_gradients`` per batch
``--shape accumulate``   gradients of ``--micro`` micro-batches summed eagerly, one update per
                         ``--micro`` batches; the step's loss printed is its first micro-batch's
``--shape fit``          ``model.fit(run_eagerly=True)`` (Keras runs its train step eagerly)

Each shape also runs an FGSM-style probe after training (a gradient with respect to the input,
no optimizer): that is not a training step. Prints ``step N loss X`` for every update (its loss
as the script computes it) and ``updates N`` (the optimizer's own count) at the end. With
``TF_USE_LEGACY_KERAS=1`` it uses tf_keras.
"""

import argparse
import os

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--shape", choices=("walkthrough", "accumulate", "fit"), default="walkthrough")
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--batches", type=int, default=5)
p.add_argument("--micro", type=int, default=3)
a = p.parse_args()

if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
    import tf_keras as keras
else:
    import keras

keras.utils.set_random_seed(3)
rng = np.random.default_rng(3)
batch = 32
n = batch * a.batches * (a.micro if a.shape == "accumulate" else 1)
features = rng.normal(size=(n, 4)).astype("float32")
labels = (features[:, 0] > 0).astype("int64") + (features[:, 1] > 0.5).astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(batch)

model = keras.Sequential([
    keras.Input((4,)),
    keras.layers.Dense(10, activation="relu"),
    keras.layers.Dense(10, activation="relu"),
    keras.layers.Dense(3),
])
loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
optimizer = keras.optimizers.SGD(learning_rate=0.05)


def grad(x, y):
    with tf.GradientTape() as tape:
        loss_value = loss_object(y, model(x, training=True))
    return loss_value, tape.gradient(loss_value, model.trainable_variables)


if a.shape == "fit":
    class PrintLoss(keras.callbacks.Callback):  # Keras logs the running mean of the epoch
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, b, logs=None):
            print(f"epoch {self.epoch + 1} batch {b + 1} running_loss {float(logs['loss'])!r}", flush=True)

    model.compile(optimizer=optimizer, loss=loss_object, run_eagerly=True)
    model.fit(features, labels, batch_size=batch, epochs=a.epochs, shuffle=False, verbose=0,
              callbacks=[PrintLoss()])
else:
    step = 0
    for epoch in range(a.epochs):
        epoch_loss = keras.metrics.Mean()
        if a.shape == "walkthrough":
            for x, y in dataset:
                loss_value, grads = grad(x, y)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                epoch_loss.update_state(loss_value)
                step += 1
                print(f"step {step} loss {float(loss_value)!r}", flush=True)
        else:
            total, first = None, None
            for i, (x, y) in enumerate(dataset, start=1):
                loss_value, grads = grad(x, y)
                first = loss_value if first is None else first
                total = grads if total is None else [t + g for t, g in zip(total, grads)]
                if i % a.micro == 0:
                    optimizer.apply_gradients(zip([t / a.micro for t in total], model.trainable_variables))
                    epoch_loss.update_state(first)
                    step += 1
                    print(f"step {step} loss {float(first)!r}", flush=True)
                    total, first = None, None
        print(f"epoch {epoch + 1} mean loss {float(epoch_loss.result()):.4f}", flush=True)

# FGSM-style: how the loss moves with the input. No update: not a training step.
x0 = tf.convert_to_tensor(features[:batch])
with tf.GradientTape() as tape:
    tape.watch(x0)
    probe_loss = loss_object(labels[:batch], model(x0))
signed = tf.sign(tape.gradient(probe_loss, x0))
print(f"fgsm perturbation mean {float(tf.reduce_mean(signed)):.3f}")
print(f"updates {int(optimizer.iterations.numpy())}", flush=True)

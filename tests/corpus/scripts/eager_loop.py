"""An eager training loop with no tf.function at all, in the shape of TensorFlow's "Custom
training: walkthrough" and the first part of Keras' "Writing a training loop from scratch" (our
own words, synthetic penguin-like data: 4 features, 3 classes).

``--shape walkthrough``  a ``grad()`` helper returns (loss, gradients); ``apply_gradients`` per batch
``--shape accumulate``   gradients of ``--micro`` micro-batches summed eagerly, one update per
                         ``--micro`` batches; the step's loss printed is its first micro-batch's
``--shape fit``          ``model.fit(run_eagerly=True)`` (Keras runs its train step eagerly)
``--shape gan``          Keras' GAN from scratch, eagerly: a discriminator update, then a generator
                         update, on each batch (two optimizers); prints the discriminator's loss
``--shape adversarial``  adversarial training: an FGSM gradient with respect to the batch, then the
                         update on the perturbed batch; prints the loss it trains on
``--shape minimize``     tf_keras only: ``optimizer.minimize(loss, variables, tape=tape)`` with a legacy
                         optimizer (it enters the script's tape again); ``--loss-scale`` wraps it
                         in a LossScaleOptimizer
``--shape compiled_forward``  the model's forward pass is a tf.function called inside the tape
``--shape embedding``    a tf.function step in the TPU embedding guide's shape: the gradient is taken
                         with respect to the looked-up activations (tensors), and the table is
                         updated from it by hand
``--shape compiled_grads``  a tf.function returns the gradients and the update is eager, after one
                         eager gradient norm printed as a start-up check

``--jit-optimizer`` (tf_keras) compiles the optimizer's update with XLA, as tf_keras does on a GPU:
its update is a tf.function called once per variable inside ``apply_gradients``.
``--compile`` makes the adversarial step a tf.function (the same rule holds in a graph).
``--numpy`` trains on NumPy slices after one batch peeked at from the dataset (no eager fetch).
``--fetch-sleep S`` makes every batch take S seconds to fetch (a slow input pipeline);
``--forward-sleep S`` sleeps S seconds inside the tape, after the forward pass;
``--attack-sleep S`` inside the adversarial shape's perturbation tape.

Each shape also runs an FGSM-style probe after training (a gradient with respect to the input,
no optimizer): that is not a training step. Prints ``step N loss X`` for every update (its loss
as the script computes it), ``step N took T`` (seconds since the last update ended) and, at the
end, ``updates N`` (the optimizer's own count). With ``TF_USE_LEGACY_KERAS=1`` it uses tf_keras.
"""

import argparse
import os
import time

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--shape", choices=("walkthrough", "accumulate", "fit", "gan", "adversarial", "minimize",
                                   "compiled_forward", "compiled_grads", "embedding"),
               default="walkthrough")
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--batches", type=int, default=5)
p.add_argument("--micro", type=int, default=3)
p.add_argument("--fetch-sleep", type=float, default=0.0)
p.add_argument("--forward-sleep", type=float, default=0.0)
p.add_argument("--loss-scale", action="store_true")
p.add_argument("--compile", action="store_true")
p.add_argument("--jit-optimizer", action="store_true")
p.add_argument("--numpy", action="store_true")
p.add_argument("--attack-sleep", type=float, default=0.0)
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
dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(batch, drop_remainder=True)
if a.fetch_sleep:
    def slow(x):
        time.sleep(a.fetch_sleep)
        return x

    dataset = dataset.map(lambda x, y: (tf.ensure_shape(tf.numpy_function(slow, [x], tf.float32), (batch, 4)), y))
    options = tf.data.Options()  # every fetch waits in full: no prefetch thread hides a part of it
    options.experimental_optimization.inject_prefetch = False
    dataset = dataset.with_options(options)



def batches():
    if not a.numpy:
        return dataset
    return ((tf.constant(features[i:i + batch]), tf.constant(labels[i:i + batch])) for i in range(0, n, batch))


if a.numpy:
    peek_x, _ = next(iter(dataset))
    print(f"a batch has shape {tuple(peek_x.shape)}", flush=True)

model = keras.Sequential([
    keras.Input((4,)),
    keras.layers.Dense(10, activation="relu"),
    keras.layers.Dense(10, activation="relu"),
    keras.layers.Dense(3),
])
loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
optimizer = keras.optimizers.SGD(learning_rate=0.05)
if a.jit_optimizer:
    optimizer.jit_compile = True
forward = tf.function(model) if a.shape == "compiled_forward" else model


def grad(x, y):
    with tf.GradientTape() as tape:
        loss_value = loss_object(y, forward(x, training=True))
        if a.forward_sleep:
            time.sleep(a.forward_sleep)
    return loss_value, tape.gradient(loss_value, model.trainable_variables)


last_update = [time.perf_counter()]


def report(step, loss_value):
    """The step's loss, and the wall time since the previous step's update ended."""
    now = time.perf_counter()
    took, last_update[0] = now - last_update[0], now
    print(f"step {step} loss {float(loss_value)!r}", flush=True)
    print(f"step {step} took {took!r}", flush=True)
    last_update[0] = time.perf_counter()


if a.shape == "fit":
    class PrintLoss(keras.callbacks.Callback):  # Keras logs the running mean of the epoch
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, b, logs=None):
            print(f"epoch {self.epoch + 1} batch {b + 1} running_loss {float(logs['loss'])!r}", flush=True)

    model.compile(optimizer=optimizer, loss=loss_object, run_eagerly=True)
    model.fit(features, labels, batch_size=batch, epochs=a.epochs, shuffle=False, verbose=0,
              callbacks=[PrintLoss()])
elif a.shape == "gan":
    latent = 2
    generator = keras.Sequential([keras.Input((latent,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(4)])
    discriminator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                      keras.layers.Dense(1)])
    bce = keras.losses.BinaryCrossentropy(from_logits=True)
    d_optimizer = optimizer
    g_optimizer = keras.optimizers.SGD(learning_rate=0.05)
    step = 0
    for epoch in range(a.epochs):
        for real, _ in batches():
            noise = tf.random.normal((batch, latent))
            both = tf.concat([generator(noise), real], axis=0)
            truth = tf.concat([tf.ones((batch, 1)), tf.zeros((batch, 1))], axis=0)
            with tf.GradientTape() as tape:
                d_loss = bce(truth, discriminator(both))
            grads = tape.gradient(d_loss, discriminator.trainable_weights)
            d_optimizer.apply_gradients(zip(grads, discriminator.trainable_weights))
            noise = tf.random.normal((batch, latent))
            with tf.GradientTape() as tape:
                g_loss = bce(tf.zeros((batch, 1)), discriminator(generator(noise)))
            grads = tape.gradient(g_loss, generator.trainable_weights)
            g_optimizer.apply_gradients(zip(grads, generator.trainable_weights))
            step += 1
            report(step, d_loss)
            print(f"step {step} generator loss {float(g_loss):.4f}", flush=True)
elif a.shape == "adversarial":
    def adversarial_step(x, y):
        with tf.GradientTape() as tape:
            tape.watch(x)
            clean_loss = loss_object(y, model(x))
            if a.attack_sleep:
                time.sleep(a.attack_sleep)
        x_adv = x + 0.1 * tf.sign(tape.gradient(clean_loss, x))
        loss_value, grads = grad(x_adv, y)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss_value

    if a.compile:
        adversarial_step = tf.function(adversarial_step)
    step = 0
    for epoch in range(a.epochs):
        for x, y in batches():
            loss_value = adversarial_step(x, y)
            step += 1
            report(step, loss_value)
elif a.shape == "compiled_grads":
    check_x, check_y = next(iter(dataset))
    _, check = grad(check_x, check_y)
    print(f"start-up gradient norm {float(tf.linalg.global_norm(check)):.4f}", flush=True)

    @tf.function
    def gradients_of(x, y):
        with tf.GradientTape() as tape:
            loss_value = loss_object(y, model(x, training=True))
        return loss_value, tape.gradient(loss_value, model.trainable_variables)

    step = 0
    for epoch in range(a.epochs):
        for x, y in batches():
            loss_value, grads = gradients_of(x, y)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            step += 1
            report(step, loss_value)
elif a.shape == "embedding":
    table = tf.Variable(tf.random.normal((16, 4), seed=3))
    head = tf.constant(rng.normal(size=(4, 3)).astype("float32"))

    @tf.function
    def embedding_step(ids, y):
        with tf.GradientTape() as tape:
            activations = tf.nn.embedding_lookup(table, ids)
            tape.watch(activations)
            loss_value = loss_object(y, tf.matmul(activations, head))
        activation_grads = tape.gradient(loss_value, activations)
        table.scatter_sub(tf.IndexedSlices(0.05 * activation_grads, ids))
        optimizer.iterations.assign_add(1)
        return loss_value

    step = 0
    for epoch in range(a.epochs):
        for x, y in batches():
            ids = tf.cast(tf.abs(x[:, 0]) * 4, tf.int32) % 16
            loss_value = embedding_step(ids, y)
            step += 1
            report(step, loss_value)
elif a.shape == "minimize":
    optimizer = keras.optimizers.legacy.SGD(learning_rate=0.05)
    if a.loss_scale:
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    step = 0
    for epoch in range(a.epochs):
        for x, y in batches():
            with tf.GradientTape() as tape:
                loss_value = loss_object(y, model(x, training=True))
                if a.forward_sleep:
                    time.sleep(a.forward_sleep)
            optimizer.minimize(loss_value, model.trainable_variables, tape=tape)
            step += 1
            report(step, loss_value)
else:
    step = 0
    for epoch in range(a.epochs):
        epoch_loss = keras.metrics.Mean()
        if a.shape in ("walkthrough", "compiled_forward"):
            for x, y in batches():
                loss_value, grads = grad(x, y)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                epoch_loss.update_state(loss_value)
                step += 1
                report(step, loss_value)
        else:
            total, first = None, None
            for i, (x, y) in enumerate(batches(), start=1):
                loss_value, grads = grad(x, y)
                first = loss_value if first is None else first
                total = grads if total is None else [t + g for t, g in zip(total, grads)]
                if i % a.micro == 0:
                    optimizer.apply_gradients(zip([t / a.micro for t in total], model.trainable_variables))
                    epoch_loss.update_state(first)
                    step += 1
                    report(step, first)
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

"""A tiny training script for the action tests (a user script: no tpuwatch import).

Trains until the file --stop exists (or --max-steps), so a test can send commands while it runs.

--mode custom   @tf.function step around strategy.run under MirroredStrategy (4 logical CPUs)
--mode fit      Keras model.fit under the same strategy
--own-manager DIR   the script makes its own tf.train.Checkpoint + CheckpointManager in DIR
--own-keep N        its manager's max_to_keep (default: keep all)
--own-save-at S,..  the script saves its own checkpoint after each of these steps (number = step)
--big-mb N          its own checkpoint also holds an N MB variable (a save that takes a while)
--weights-log PATH  custom: after each step write "<optimizer.iterations> <weights as float32 hex>"
--sleep-ms N    sleep per step (keeps the run going without burning the CPU)
"""

import argparse
import os
import time

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--mode", default="custom")
p.add_argument("--stop", required=True)
p.add_argument("--max-steps", type=int, default=20000)
p.add_argument("--own-manager")
p.add_argument("--own-keep", type=int)
p.add_argument("--own-save-at", default="")
p.add_argument("--big-mb", type=int, default=0)
p.add_argument("--weights-log")
p.add_argument("--sleep-ms", type=float, default=0.0)
a = p.parse_args()

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
tf.random.set_seed(1)
strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(4)])


def make_model():
    return tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(4, activation="relu"),
                                tf.keras.layers.Dense(1)])


x = tf.random.normal([64 * 8, 8])
y = tf.reduce_sum(x, axis=1, keepdims=True)
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(64, drop_remainder=True).repeat()
# No autotune thread: deleting the iterator at the end joins it, and it sleeps for its optimization
# period (doubling up to 60 s); on a loaded box leaving the loop took over 180 s. The tests here
# are about the agent's actions, not that pause (tests/diagnostics/test_planted_teardown.py is).
options = tf.data.Options()
options.autotune.enabled = False
ds = ds.with_options(options)

with strategy.scope():
    model = make_model()
    optimizer = tf.keras.optimizers.SGD(0.01)
    if a.own_manager:
        extra = {"big": tf.Variable(tf.zeros([a.big_mb << 18]), trainable=False)} if a.big_mb else {}
        ckpt = tf.train.Checkpoint(net=model, opt=optimizer, **extra)
        manager = tf.train.CheckpointManager(ckpt, a.own_manager, max_to_keep=a.own_keep)
own_saves = {int(s) for s in a.own_save_at.split(",") if s}


class Stop(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if a.sleep_ms:
            time.sleep(a.sleep_ms / 1000)
        if os.path.exists(a.stop):
            self.model.stop_training = True


if a.mode == "fit":
    with strategy.scope():
        model.compile(optimizer=optimizer, loss="mse")
    model.fit(ds, epochs=1, steps_per_epoch=a.max_steps, verbose=0, callbacks=[Stop()])
else:
    dist = strategy.experimental_distribute_dataset(ds)

    @tf.function
    def train_step(batch):
        def replica(b):
            xb, yb = b
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2) / strategy.num_replicas_in_sync
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.reduce("SUM", strategy.run(replica, args=(batch,)), axis=None)

    log = open(a.weights_log, "w") if a.weights_log else None
    for i, batch in enumerate(dist):
        train_step(batch)
        if log is not None:
            flat = np.concatenate([v.numpy().ravel() for v in model.weights]).astype(np.float32)
            log.write(f"{int(optimizer.iterations.numpy())} {flat.tobytes().hex()}\n")
            log.flush()
        if i + 1 in own_saves:
            manager.save(checkpoint_number=i + 1)
            print(f"saved own checkpoint {i + 1}", flush=True)
        if a.sleep_ms:
            time.sleep(a.sleep_ms / 1000)
        if i + 1 >= a.max_steps or os.path.exists(a.stop):
            break
print("trainer done", flush=True)

"""A small real training loop for the robustness tests (a user script: tpuwatch is not needed).

MirroredStrategy over 4 logical CPU devices, a @tf.function step with strategy.run.

--steps N           training steps (default 20)
--step-sleep S      seconds to sleep after each step (makes the run last long enough to poke at)
--api-steps M       then M quick steps marked with tpuwatch.step() (a big recording, fast)
--hang-after K      after step K, hang in hang_here() forever (stack-dump tests)
--ready PATH        write the step number to PATH after each step (tests wait on it)
--linger S          sleep S seconds before exiting
--stop-file PATH    end the training loop early once PATH exists
--width W           hidden units per hidden layer (default 16)
--depth D           hidden layers (default 1; 2 x 1024 units make a ~20-40 ms step on a 2-core CPU)
"""

import argparse
import os
import time
from pathlib import Path

import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--step-sleep", type=float, default=0.0)
p.add_argument("--api-steps", type=int, default=0)
p.add_argument("--hang-after", type=int, default=0)
p.add_argument("--ready")
p.add_argument("--linger", type=float, default=0.0)
p.add_argument("--stop-file")
p.add_argument("--width", type=int, default=16)
p.add_argument("--depth", type=int, default=1)
a = p.parse_args()

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
tf.random.set_seed(1)
x = tf.random.normal([64, 8])
y = tf.reduce_sum(x, axis=1, keepdims=True)
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(64).repeat()

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)),
                                 *(tf.keras.layers.Dense(a.width, activation="relu") for _ in range(a.depth)),
                                 tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.01)


def replica_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function
def train_step(x, y):
    return strategy.reduce("MEAN", strategy.run(replica_step, args=(x, y)), axis=None)


def hang_here():
    while True:
        time.sleep(0.2)  # HANG-LINE: the stack-dump test looks for this line


it = iter(strategy.experimental_distribute_dataset(ds))
for step in range(1, a.steps + 1):
    loss = train_step(*next(it))
    if a.ready:  # written whole then renamed: a test reading it never sees it half written
        Path(a.ready + ".tmp").write_text(str(step))
        os.replace(a.ready + ".tmp", a.ready)
    if a.hang_after and step == a.hang_after:
        print(f"hanging after step {step}", flush=True)
        hang_here()
    if a.step_sleep:
        time.sleep(a.step_sleep)
    if a.stop_file and Path(a.stop_file).exists():
        break
print(f"trained {step} steps, loss {float(loss):.4f}", flush=True)

if a.api_steps:
    import tpuwatch

    for i in range(a.api_steps):
        with tpuwatch.step(examples=64) as s:
            s.loss = 1.0 / (i + 1)
    print(f"marked {a.api_steps} api steps", flush=True)

if a.linger:
    time.sleep(a.linger)

"""Small training loops for the agent's integration tests (a user script: no tpuwatch import).

--mode fit          Keras model.fit under MirroredStrategy
--mode custom       @tf.function step with strategy.run, `for x in dist_dataset`
--mode iterator_fn  @tf.function taking the distributed iterator, next() inside, --per-call k steps
--mode eager_run    strategy.run called eagerly (no tf.function at all)
--mode default      the default strategy, plain `for x in dataset` and a tf.function step
--input slow        a pipeline that sleeps --sleep-ms per batch, no prefetch, no autotune
--input fast        cached and prefetched
--ragged            batches of varying sizes (retraces)
--float-arg         pass a Python float learning-rate argument that changes (retraces)
--loss-log PATH     write "step,reduced_loss" per step (fit: derived from Keras' running mean)
"""

import argparse
import time

import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--mode", default="custom")
p.add_argument("--input", default="fast")
p.add_argument("--replicas", type=int, default=4)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--per-call", type=int, default=1)
p.add_argument("--width", type=int, default=32, help="hidden units: larger makes steps longer")
p.add_argument("--sleep-ms", type=float, default=20, help="--input slow: sleep per batch")
p.add_argument("--ragged", action="store_true")
p.add_argument("--float-arg", action="store_true")
p.add_argument("--loss-log")
a = p.parse_args()

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
tf.random.set_seed(1)
if a.mode == "default":
    strategy = tf.distribute.get_strategy()
else:
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(a.replicas)])

GLOBAL_BATCH = 16 * a.replicas
n = GLOBAL_BATCH * a.steps
x = tf.random.normal([n, 8])
y = tf.reduce_sum(x, axis=1, keepdims=True) + tf.random.normal([n, 1], stddev=0.1)
ds = tf.data.Dataset.from_tensor_slices((x, y))
if a.ragged:
    sizes = [GLOBAL_BATCH, GLOBAL_BATCH - 8, GLOBAL_BATCH - 16, GLOBAL_BATCH - 24]
    parts = [ds.skip(i * GLOBAL_BATCH).take(sizes[i % 4]).batch(sizes[i % 4]) for i in range(a.steps)]
    ds = parts[0]
    for part in parts[1:]:
        ds = ds.concatenate(part)
else:
    ds = ds.batch(GLOBAL_BATCH, drop_remainder=True)
if a.input == "slow":
    def sleepy(x, y):
        time.sleep(a.sleep_ms / 1000)
        return x, y

    ds = ds.map(lambda x, y: tf.numpy_function(sleepy, [x, y], [tf.float32, tf.float32], stateful=True))
    ds = ds.map(lambda x, y: (tf.ensure_shape(x, [None, 8]), tf.ensure_shape(y, [None, 1])))
    opts = tf.data.Options()
    opts.experimental_optimization.inject_prefetch = False
    opts.autotune.enabled = False
    ds = ds.with_options(opts)
else:
    ds = ds.cache().prefetch(tf.data.AUTOTUNE)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(a.width, activation="relu"),
                                 tf.keras.layers.Dense(a.width, activation="relu"), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.01)

log = open(a.loss_log, "w") if a.loss_log else None
step = 0


def write(value):
    global step
    step += 1
    if log:
        log.write(f"{step},{value!r}\n")
        log.flush()


if a.mode == "fit":
    model.compile(optimizer, "mse")

    class Reduced(tf.keras.callbacks.Callback):
        """Keras logs a running mean; n*M_n - (n-1)*M_{n-1} is the step's own mean over replicas."""

        def on_epoch_begin(self, epoch, logs=None):
            self.prev = 0.0

        def on_train_batch_end(self, batch, logs=None):
            m = float(logs["loss"])
            write((batch + 1) * m - batch * self.prev)
            self.prev = m

    model.fit(ds.repeat(), epochs=a.epochs, steps_per_epoch=a.steps // a.epochs, verbose=0, callbacks=[Reduced()])
else:
    def replica_step(x, y, lr):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    if a.mode == "iterator_fn":
        @tf.function
        def train_calls(iterator):
            total = tf.constant(0.0)
            for _ in tf.range(a.per_call):
                x, y = next(iterator)
                per_replica = strategy.run(replica_step, args=(x, y, 0.01))
                total += strategy.reduce("MEAN", per_replica, axis=None)
            return total / a.per_call

        it = iter(strategy.experimental_distribute_dataset(ds))
        for _ in range(a.steps // a.per_call):
            write(float(train_calls(it)))
    elif a.mode == "eager_run":
        for x, y in strategy.experimental_distribute_dataset(ds):
            per_replica = strategy.run(replica_step, args=(x, y, 0.01))
            write(float(strategy.reduce("MEAN", per_replica, axis=None)))
    else:
        @tf.function
        def train_step(x, y, lr):
            per_replica = strategy.run(replica_step, args=(x, y, lr))
            return strategy.reduce("MEAN", per_replica, axis=None)

        data = ds if a.mode == "default" else strategy.experimental_distribute_dataset(ds)
        lr = 0.01
        for x, y in data:
            if a.float_arg:
                lr = lr * 0.5
            write(float(train_step(x, y, lr)))
print(f"done {step} steps")

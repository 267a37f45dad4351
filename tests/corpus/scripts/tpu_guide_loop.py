"""A custom loop in the shape of TensorFlow's "Use TPUs" guide (our own words, synthetic data).

Connects to a TPU when the resolver finds one; here it falls back to MirroredStrategy over logical
CPUs. The replica function returns nothing: it updates a ``keras.metrics.Mean`` with the loss
times the replicas in sync, and several steps run per call in a ``tf.range`` loop. Prints the
metric after every call (``call N steps K training_loss X``), as the guide prints per epoch.

With ``--batches N`` the dataset is finite (no ``repeat``) and the loop calls until it runs out,
as loops over a finite dataset do: the call that finds no batch raises ``OutOfRangeError``, after
the steps that found one trained. ``--unrolled`` runs the steps of a call in a Python loop (the
function traces each step: a fixed number a call) instead of ``tf.range``; ``--replicas 0`` trains
on the default strategy (a plain iterator); ``--eagerly`` runs the functions eagerly. Prints the batches
the data held (one step each) and the optimizer's iterations, which count more: the increment
needs no batch, and TensorFlow ran it for steps whose fetch failed.
"""

import argparse

import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--replicas", type=int, default=4)
p.add_argument("--calls", type=int, default=3)
p.add_argument("--steps-per-call", type=int, default=4)
p.add_argument("--batches", type=int, default=0, help="a finite dataset of this many batches, called until it runs out")
p.add_argument("--unrolled", action="store_true", help="a Python loop over the call's steps")
p.add_argument("--eagerly", action="store_true", help="tf.config.run_functions_eagerly(True)")
a = p.parse_args()

try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    strategy = tf.distribute.TPUStrategy(resolver)
except (ValueError, tf.errors.NotFoundError) as e:
    if not a.replicas:
        print(f"No TPU ({type(e).__name__}); using the default strategy")
        strategy = tf.distribute.get_strategy()
    else:
        print(f"No TPU ({type(e).__name__}); using MirroredStrategy")
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
        strategy = tf.distribute.MirroredStrategy()
tf.config.run_functions_eagerly(a.eagerly)

per_replica_batch_size = 16
batch_size = per_replica_batch_size * strategy.num_replicas_in_sync


def get_dataset(batch_size, batches=0):
    x = tf.random.stateless_uniform([batch_size * 8, 28, 28], seed=(1, 2))
    y = tf.random.stateless_uniform([batch_size * 8], seed=(3, 4), maxval=10, dtype=tf.int32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64).batch(batch_size, drop_remainder=True)
    if batches:
        return dataset.repeat().take(batches)
    return dataset.repeat()


def dataset_fn(ctx):
    # each input pipeline feeds its replicas a batch each a step: a.batches global batches
    per_pipeline = a.batches * ctx.num_replicas_in_sync // ctx.num_input_pipelines
    return get_dataset(ctx.get_per_replica_batch_size(batch_size), per_pipeline)


with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.Input((28, 28)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    optimizer = tf.keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    training_loss = tf.keras.metrics.Mean("training_loss", dtype=tf.float32)
    training_accuracy = tf.keras.metrics.SparseCategoricalAccuracy("training_accuracy", dtype=tf.float32)

train_dataset = strategy.distribute_datasets_from_function(dataset_fn)
train_iterator = iter(train_dataset)


@tf.function
def train_multiple_steps(iterator, steps):
    def step_fn(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_example_loss = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_example_loss)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(list(zip(grads, model.trainable_variables)))
        training_loss.update_state(loss * strategy.num_replicas_in_sync)
        training_accuracy.update_state(labels, logits)

    if a.unrolled:
        for _ in range(a.steps_per_call):
            strategy.run(step_fn, args=(next(iterator),))
    else:
        for _ in tf.range(steps):
            strategy.run(step_fn, args=(next(iterator),))


if a.batches:
    calls = 0
    while True:
        try:
            train_multiple_steps(train_iterator, tf.convert_to_tensor(a.steps_per_call))
        except (tf.errors.OutOfRangeError, StopIteration):  # StopIteration: run eagerly
            break
        calls += 1
    print(f"ran out of data after {calls} whole calls; {a.batches} batches; "
          f"optimizer iterations {int(optimizer.iterations.numpy())}")

for call in range(a.calls if not a.batches else 0):
    train_multiple_steps(train_iterator, tf.convert_to_tensor(a.steps_per_call))
    print(f"call {call + 1} steps {a.steps_per_call} training_loss {float(training_loss.result())!r} "
          f"accuracy {float(training_accuracy.result()):.3f}")
    training_loss.reset_state()
    training_accuracy.reset_state()

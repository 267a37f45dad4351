"""Where the training step sits inside a tf.function, in the shapes users write; the script's own
step count is its optimizer's ``iterations``, printed after every call as ``call N iterations K``.

--shape unrolled     a Python loop of two ``strategy.run`` calls in one function (two steps a call)
--shape conditional  the step trains only on even calls (an autograph ``if`` on a tensor), and
                     evaluates on odd ones
--shape nested       a tf.function step called eagerly per batch, then the same function called in
                     a ``tf.range`` loop of another tf.function
--shape no_strategy  no distribution strategy: a whole epoch in one tf.function, with two tapes and
                     two optimizers per batch (a GAN's shape)
--shape lazy_state   the step makes a variable on its first call from its learning-rate argument
                     (as an optimizer built lazily does: TensorFlow then traces the step a second
                     time, inside a ``cond`` that initialises the variable on first use); a plain
                     SGD update by hand; it returns its replicas' losses unreduced
"""

import argparse

import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--shape", required=True)
p.add_argument("--replicas", type=int, default=2)
p.add_argument("--calls", type=int, default=4)
p.add_argument("--run-functions-eagerly", action="store_true", help="tf.config.run_functions_eagerly(True)")
a = p.parse_args()
if a.run_functions_eagerly:
    tf.config.run_functions_eagerly(True)

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
strategy = (tf.distribute.MirroredStrategy() if a.shape not in ("no_strategy", "perturbed")
            else tf.distribute.get_strategy())
GLOBAL_BATCH = 8 * strategy.num_replicas_in_sync

features = tf.random.normal([GLOBAL_BATCH * 64, 6], seed=5)
labels = tf.reduce_sum(features, axis=1, keepdims=True)
dataset = tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(GLOBAL_BATCH, drop_remainder=True)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    critic = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.01)
    critic_optimizer = tf.keras.optimizers.SGD(0.01)


def replica_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss


def replica_eval(x, y):
    return tf.reduce_mean(tf.square(model(x, training=False) - y))


if a.shape == "unrolled":
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    @tf.function
    def train_two(iterator):
        for _ in range(2):  # a Python loop: unrolled into the graph
            x, y = next(iterator)
            strategy.run(replica_step, args=(x, y))

    for call in range(a.calls):
        train_two(iterator)
        print(f"call {call + 1} iterations {int(optimizer.iterations.numpy())}", flush=True)

elif a.shape == "conditional":
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    @tf.function
    def train_or_eval(iterator, call):
        x, y = next(iterator)
        if call % 2 == 0:
            strategy.run(replica_step, args=(x, y))
        else:
            strategy.run(replica_eval, args=(x, y))

    for call in range(a.calls):
        train_or_eval(iterator, tf.constant(call))
        print(f"call {call + 1} iterations {int(optimizer.iterations.numpy())}", flush=True)

elif a.shape == "nested":
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    @tf.function
    def train_step(x, y):
        strategy.run(replica_step, args=(x, y))

    @tf.function
    def train_many(iterator, n):
        for _ in tf.range(n):
            x, y = next(iterator)
            train_step(x, y)

    for call in range(a.calls):
        if call < a.calls // 2:
            x, y = next(iterator)
            train_step(x, y)
        else:
            train_many(iterator, tf.constant(3))
        print(f"call {call + 1} iterations {int(optimizer.iterations.numpy())}", flush=True)

elif a.shape == "no_strategy":
    epoch = dataset.take(5)

    @tf.function
    def train_epoch():
        last = tf.constant(0.0)
        for x, y in epoch:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            with tf.GradientTape() as tape:
                score = tf.reduce_mean(critic(model(x, training=False)))
            critic_optimizer.apply_gradients(zip(tape.gradient(score, critic.trainable_variables),
                                                 critic.trainable_variables))
            last = loss
        return last

    for call in range(a.calls):
        last = train_epoch()
        print(f"call {call + 1} iterations {int(optimizer.iterations.numpy())} loss {float(last)!r}", flush=True)

elif a.shape == "perturbed":
    # Adversarial training (PGD-style, no strategy): three gradients with respect to the input
    # make the batch it trains on, then one with respect to the model's variables.
    iterator = iter(dataset)

    @tf.function
    def train_step(iterator):
        x, y = next(iterator)
        x_adv = x
        for _ in range(3):  # a Python loop: unrolled
            with tf.GradientTape() as tape:
                tape.watch(x_adv)
                attack = tf.reduce_mean(tf.square(model(x_adv, training=False) - y))
            x_adv = x_adv + 0.01 * tf.sign(tape.gradient(attack, x_adv))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x_adv, training=True) - y))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    for call in range(a.calls):
        loss = train_step(iterator)
        print(f"call {call + 1} iterations {int(optimizer.iterations.numpy())} loss {float(loss)!r}", flush=True)

elif a.shape == "lazy_state":
    # A plain SGD update by hand (TF's "basic training loops" guide), scaled by a variable made on
    # the first call: Keras 3's optimizers cannot make their own variables inside that cond.
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    with strategy.scope():
        iterations = tf.Variable(0, dtype=tf.int64, trainable=False)
    state = {}

    def replica_sgd_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        for v, g in zip(model.trainable_variables, grads):
            v.assign_sub(0.01 * state["lr_scale"] * g)
        return loss

    @tf.function
    def train_step(iterator, lr_scale):
        if "lr_scale" not in state:  # made from an argument: TF cannot lift its initializer
            state["lr_scale"] = tf.Variable(lr_scale, trainable=False)
        x, y = next(iterator)
        per_replica = strategy.run(replica_sgd_step, args=(x, y))
        iterations.assign_add(1)
        return per_replica  # each replica's loss, unreduced (the script averages them to log)

    for call in range(a.calls):
        losses = strategy.experimental_local_results(train_step(iterator, tf.constant(0.5)))
        loss = sum(float(v) for v in losses) / len(losses)
        print(f"call {call + 1} iterations {int(iterations.numpy())} loss {loss!r}", flush=True)

else:
    raise SystemExit(f"unknown --shape {a.shape}")

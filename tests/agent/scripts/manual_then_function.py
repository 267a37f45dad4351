"""The "basic training loops" guide's shape, twice: a few steps by hand (a tape, ``assign_sub``)
marked with tpuwatch.step(), then the same step as a tf.function (no strategy). Prints the
script's own step count."""

import tensorflow as tf

import tpuwatch

w = tf.Variable(2.0)
b = tf.Variable(0.5)
x = tf.random.normal([64], seed=3)
y = 3.0 * x + 1.0


def loss_fn():
    return tf.reduce_mean(tf.square(w * x + b - y))


steps = 0
for _ in range(4):
    with tpuwatch.step(examples=64) as s:
        with tf.GradientTape() as tape:
            loss = loss_fn()
        dw, db = tape.gradient(loss, [w, b])
        w.assign_sub(0.1 * dw)
        b.assign_sub(0.1 * db)
        s.loss = float(loss)
    steps += 1


@tf.function
def train_step():
    with tf.GradientTape() as tape:
        loss = loss_fn()
    dw, db = tape.gradient(loss, [w, b])
    w.assign_sub(0.1 * dw)
    b.assign_sub(0.1 * db)
    return loss


for _ in range(3):
    train_step()
    steps += 1
print(f"ran {steps} steps")

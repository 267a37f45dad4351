"""Ends in a chosen way after a few training steps: --raise, --exit N, --signal NAME."""

import argparse
import os
import signal

import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--raise", dest="raise_", action="store_true")
p.add_argument("--exit", type=int)
p.add_argument("--signal")
a = p.parse_args()

w = tf.Variable(1.0)


@tf.function
def step(x):
    with tf.GradientTape() as tape:
        loss = tf.square(w * x - 2.0)
    w.assign_sub(0.1 * tape.gradient(loss, w))
    return loss


for i in range(3):
    step(tf.constant(1.0))
if a.raise_:
    raise ValueError("planted failure after 3 steps")
if a.signal:
    os.kill(os.getpid(), getattr(signal, a.signal))
if a.exit is not None:
    raise SystemExit(a.exit)
print("ok", float(w.numpy()))

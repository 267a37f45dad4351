"""Ends with a teardown that hangs (as TensorFlow's can, destroying live distributed iterators at
interpreter exit): an object whose destructor blocks, held by a module global. Before that: a
non-daemon thread that trains after the main module returns, an atexit handler and a file left
unflushed, all of which Python would have honoured. Exits with --code."""

import argparse
import atexit
import sys
import threading
import time

import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--code", type=int, default=3)
p.add_argument("--out", required=True)
p.add_argument("--thread-steps", type=int, default=5)
a = p.parse_args()


class BlocksOnDelete:
    def __del__(self):
        time.sleep(600)


keep_me = BlocksOnDelete()
unflushed = open(a.out, "w")
unflushed.write("written-but-not-flushed")
atexit.register(lambda: print("atexit handler ran", flush=True))

v = tf.Variable(1.0)
opt = tf.keras.optimizers.SGD(0.1)


@tf.function
def train_step():
    with tf.GradientTape() as tape:
        loss = v * v
    opt.apply_gradients([(tape.gradient(loss, v), v)])
    return loss


def train_later():
    time.sleep(0.5)  # after the main module has returned
    for _ in range(a.thread_steps):
        train_step()
    print(f"thread trained {a.thread_steps} steps", flush=True)


threading.Thread(target=train_later).start()
print(f"main module done at {time.time()!r}", flush=True)
sys.exit(a.code)

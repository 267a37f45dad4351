"""Restores checkpoints into a fresh model and optimizer; prints one JSON line per checkpoint.

python restore.py [--own] PREFIX...   (--own: the trainer's own layout, net/opt; else model/optimizer/tpuwatch_step)
Each line: {"path", "step" (tpuwatch_step or null), "iterations", "weights" (float32 hex)}.
"""

import json
import sys

import numpy as np
import tensorflow as tf

own = "--own" in sys.argv
paths = [p for p in sys.argv[1:] if p != "--own"]
for path in paths:
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(4, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.01)
    optimizer.build(model.trainable_variables)
    step = tf.Variable(-1, dtype=tf.int64)
    if own:
        ckpt = tf.train.Checkpoint(net=model, opt=optimizer)
    else:
        ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, tpuwatch_step=step)
    ckpt.restore(path).assert_existing_objects_matched()
    flat = np.concatenate([v.numpy().ravel() for v in model.weights]).astype(np.float32)
    print(json.dumps({"path": path, "step": None if own else int(step.numpy()),
                      "iterations": int(optimizer.iterations.numpy()), "weights": flat.tobytes().hex()}), flush=True)

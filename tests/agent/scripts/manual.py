"""A pure-Python loop the patches cannot see as steps (no tf.function, no strategy, no tape):
it marks its steps with tpuwatch.step()."""

import numpy as np
import tensorflow as tf

import tpuwatch

w = tf.Variable(0.0)
for i in range(5):
    with tpuwatch.step(examples=32) as s:
        x = np.full(32, float(i))
        loss = float(np.mean((x - w.numpy()) ** 2))
        w.assign_add(0.1)
        s.loss = loss
print("manual done")

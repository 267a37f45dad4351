"""Crash: an unbatched dataset handed to ``experimental_distribute_dataset`` (the strategy can
only split a batch dimension across replicas)."""
import tensorflow as tf

from _common import data, mirrored

strategy = mirrored()
x, y = data()
ds = tf.data.Dataset.from_tensor_slices((x, y))  # .batch(global_batch) forgotten
for batch in strategy.experimental_distribute_dataset(ds):
    break

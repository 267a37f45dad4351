"""The custom training loop the agent benches time (shared so that they time the same thing).

The step is what the distributed-training tutorials write: ``next(iterator)`` inside the step
function, ``strategy.run`` of a replica step that computes a mean squared error with a
``GradientTape`` and applies SGD, and ``strategy.reduce(MEAN)`` of the losses. Synthetic data,
``64 * replicas`` examples a step.
"""

from __future__ import annotations

from typing import Any, Callable


def custom_loop(strategy: Any, replicas: int, width: int, hidden: int = 2) -> tuple[Callable[[Any], Any], Any]:
    """``(step, iterator)``: ``step`` is the plain Python step function (wrap it in
    ``tf.function`` as many times as there are traces to compare); ``iterator`` feeds it."""
    import tensorflow as tf

    with strategy.scope():
        layers = [tf.keras.layers.Dense(width, activation="relu") for _ in range(hidden)]
        model = tf.keras.Sequential([tf.keras.Input((64,)), *layers, tf.keras.layers.Dense(1)])
        opt = tf.keras.optimizers.SGD(0.001)
    ds = tf.data.Dataset.from_tensor_slices((tf.random.normal([4096, 64]), tf.random.normal([4096, 1])))
    it = iter(strategy.experimental_distribute_dataset(
        ds.repeat().batch(64 * replicas, drop_remainder=True).prefetch(tf.data.AUTOTUNE)))

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    def step(iterator):
        x, y = next(iterator)
        return strategy.reduce("MEAN", strategy.run(replica_step, args=(x, y)), axis=None)

    return step, it

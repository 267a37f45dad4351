"""Counts the sends between devices in one step of a custom loop that fetches inside its step
(``next(iterator)`` then ``strategy.run``, MirroredStrategy over 4 logical CPUs), traced with and
without the agent's probes. Prints ``plain N`` and ``probed N``: every ``_Send`` in the
partitioned graphs TF runs (a control edge's too), and ``disabled [...]``."""

import sys
import tempfile
from pathlib import Path

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)

from tensorflow.python.eager import context  # noqa: E402

from tpuwatch.agent import post_import, probes  # noqa: E402
from tpuwatch.agent.runtime import Agent  # noqa: E402

agent = Agent(Path(tempfile.mkdtemp()), "loop-transfers")
patches = probes.install_all(agent, "loop_transfers.py", [], set())
strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(4), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.01)
data = tf.data.Dataset.from_tensor_slices((tf.random.normal([1024, 16]), tf.random.normal([1024, 1])))
iterator = iter(strategy.experimental_distribute_dataset(data.repeat().batch(64, drop_remainder=True)))


def replica_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss


def step(it):
    x, y = next(it)
    return strategy.reduce("MEAN", strategy.run(replica_step, args=(x, y)), axis=None)


def sends(probed: bool) -> int:
    (patches.resume if probed else patches.suspend)()
    ctx = context.context()
    ctx.enable_graph_collection()
    try:
        fn = tf.function(step)
        fn(iterator)
        fn(iterator)
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_graph_collection()
        patches.resume()
    return sum(node.op in ("_Send", "_HostSend") for graphs in metadata.function_graphs
               for graph in graphs.partition_graphs for node in graph.node)


tf.function(step)(iterator)  # the probes make their variables once, before counting
print("plain", sends(False))
print("probed", sends(True))
print("disabled", sorted(agent.disabled_probes))
probes.uninstall(patches)
post_import.cancel_all()
agent.stop()
sys.exit(0)

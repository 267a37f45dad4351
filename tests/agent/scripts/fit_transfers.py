"""Counts the tensors Keras fit's train function sends between devices in one step, traced with
and without the agent's probes (MirroredStrategy over 4 logical CPUs, static batch). Prints
``plain N`` and ``probed N``: data transfers (a ``_Send`` of a value, not of a control edge) in
the partitioned graphs TF runs."""

import sys
import tempfile
from pathlib import Path

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)

import keras  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402

from tpuwatch.agent import post_import, probes  # noqa: E402
from tpuwatch.agent.runtime import Agent  # noqa: E402

agent = Agent(Path(tempfile.mkdtemp()), "transfers")
patches = probes.install_all(agent, "fit_transfers.py", [], set())
strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
data = tf.data.Dataset.from_tensor_slices((tf.random.normal([1024, 16]), tf.random.normal([1024, 1])))
data = data.repeat().batch(64, drop_remainder=True).prefetch(2)


def transfers(probed: bool) -> int:
    with strategy.scope():
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    (patches.resume if probed else patches.suspend)()
    ctx = context.context()
    ctx.enable_graph_collection()
    ctx.enable_run_metadata()
    model.fit(data, steps_per_epoch=2, epochs=1, verbose=0)  # traces and runs the train function
    metadata = ctx.export_run_metadata()
    ctx.disable_graph_collection()
    ctx.disable_run_metadata()
    patches.resume()
    count = 0
    for function_graph in metadata.function_graphs:
        for partition in function_graph.partition_graphs:
            by_name = {n.name: n for n in partition.node}
            for node in partition.node:
                if node.op in ("_Send", "_HostSend") and node.input:
                    source = by_name.get(node.input[0].split(":")[0].lstrip("^"))
                    if source is None or "/ctrl/" not in source.name:
                        count += 1
    return count


print("plain", transfers(False))
print("probed", transfers(True))
print("disabled", sorted(agent.disabled_probes))
probes.uninstall(patches)
post_import.cancel_all()
agent.stop()
sys.exit(0)

"""Where the loss probe writes each replica's loss in a custom loop over 4 logical CPUs, traced
with the agent's probes, and whether what the agent reads is what the step computed.

Two steps: ``reduced`` hands the replicas' losses to ``strategy.reduce`` (the tutorials' shape),
``kept`` returns them per replica, unreduced. Each is traced once with graph collection on, then
called a few times; prints, per step, ``<step> host N replicas N sends N match B``: the loss
writes (``AssignVariableOp``) the probes add to the partition graphs TF runs on the host's CPU:0
and on the other devices, the ``_Send``s they add over the same step traced without the probes,
and whether the agent's read of the last call's losses equals the step's own per-replica values.
Then ``left N M``: what the probe still holds of a trace that raised after its ``strategy.run``
(it holds that graph's tensors), and ``disabled [...]``."""

import sys
import tempfile
from collections import Counter
from pathlib import Path

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)

from tensorflow.python.eager import context  # noqa: E402

from tpuwatch.agent import post_import, probes  # noqa: E402
from tpuwatch.agent.runtime import Agent  # noqa: E402

agent = Agent(Path(tempfile.mkdtemp()), "loss-writes")
patches = probes.install_all(agent, "loss_writes.py", [], set())
strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(4), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.01)
data = tf.data.Dataset.from_tensor_slices((tf.random.normal([1024, 16]), tf.random.normal([1024, 1])))
dist = strategy.experimental_distribute_dataset(data.repeat().batch(64, drop_remainder=True))


def replica_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss


def reduced(batch):
    per = strategy.run(replica_step, args=batch)
    return strategy.reduce("MEAN", per, axis=None), per


def kept(batch):
    return strategy.run(replica_step, args=batch)


def collected(fn, batch) -> Counter:
    """(op, "host" or "replica") counts of the partition graphs of a fresh trace of ``fn``."""
    ctx = context.context()
    ctx.enable_graph_collection()
    try:
        f = tf.function(fn)
        f(batch)
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_graph_collection()
    counts: Counter = Counter()
    for graphs in metadata.function_graphs:
        for graph in graphs.partition_graphs:
            for node in graph.node:
                counts[(node.op, "host" if node.device.endswith("CPU:0") else "replica")] += 1
    return counts


it = iter(dist)
for name, fn in (("reduced", reduced), ("kept", kept)):
    tf.function(fn)(next(it))  # the probes make their variables once, before counting
    patches.suspend()
    plain = collected(fn, next(it))
    patches.resume()
    probed = collected(fn, next(it))
    added = probed.copy()
    added.subtract(plain)
    f = tf.function(fn)
    probe = agent.step_probe
    for _ in range(3):
        out = f(next(it))
    per = out[1] if name == "reduced" else out
    own = [float(v) for v in strategy.experimental_local_results(per)]
    read = probe.loss_reader(probe.trace.flags[f])
    match = read is not None and all(abs(a - b) <= 1e-6 * max(1.0, abs(b)) for a, b in zip(read, own)) \
        and len(read) == len(own)
    print(name, "host", added[("AssignVariableOp", "host")], "replicas", added[("AssignVariableOp", "replica")],
          "sends", added[("_Send", "host")] + added[("_Send", "replica")], "match", match, flush=True)


def broken(batch):
    per = strategy.run(replica_step, args=batch)
    raise ValueError(f"the script's own error, after {per}")


try:
    tf.function(broken)(next(it))
except ValueError:
    pass
loss_probe = agent.step_probe.loss_reader.__self__
print("left", len(loss_probe._pending), len(loss_probe._awaiting))  # a failed trace's losses let go
print("disabled", sorted(agent.disabled_probes))
probes.uninstall(patches)
post_import.cancel_all()
agent.stop()
sys.exit(0)

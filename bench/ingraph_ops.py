"""What the in-graph probes add to the graphs TensorFlow runs, device by device.

The graph a probe adds to (bench/overhead.py counts its ops: ``Identity``, ``AssignVariableOp``,
``Timestamp``...) is not what runs: TensorFlow splits a multi-device function into one graph per
device and puts a ``_Send``/``_Recv`` pair on every edge between two devices (a control edge's
with a dummy ``Const`` to send). This bench counts the nodes of those partition graphs, collected
by TensorFlow (``context.enable_graph_collection``) for bench/overhead.py's tiny step
(MirroredStrategy over logical CPUs, ``next()`` inside the step function), traced once without the
agent's patches (plain) and once with them (instrumented). Counts are exact; bench/overhead.py
gives the cost.

    python bench/ingraph_ops.py [--replicas 4]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _custom_loop import custom_loop  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=4)
    a = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import tensorflow as tf
    from tensorflow.python.eager import context

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
    from tpuwatch.agent import probes
    from tpuwatch.agent.runtime import Agent

    agent = Agent(Path(tempfile.mkdtemp(prefix="tpuwatch-bench-")), "bench", sample_hz=4)
    patches = probes.install_all(agent, "bench", ["bench"], set())
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(a.replicas)])
    step, it = custom_loop(strategy, a.replicas, 8)

    def partitions(instrumented: bool) -> tuple[collections.Counter, collections.Counter]:
        """(nodes by op type, nodes by device) of the partition graphs of one fresh trace."""
        if not instrumented:
            patches.suspend()
        ctx = context.context()
        ctx.enable_graph_collection()  # collected as a function is instantiated: a fresh trace
        try:
            fn = tf.function(step)
            fn(it)
            fn(it)
            metadata = ctx.export_run_metadata()
        finally:
            ctx.disable_graph_collection()
            if not instrumented:
                patches.resume()
        by_op: collections.Counter = collections.Counter()
        by_device: collections.Counter = collections.Counter()
        for function_graphs in metadata.function_graphs:
            for graph in function_graphs.partition_graphs:
                for node in graph.node:
                    by_op[node.op] += 1
                    by_device[node.device.rsplit("/", 1)[-1]] += 1
        return by_op, by_device

    tf.function(step)(it)  # the probes make their variables once (not a step's work): before counting
    plain_ops, plain_devices = partitions(instrumented=False)
    ops, devices = partitions(instrumented=True)
    if not plain_ops:
        print("TensorFlow collected no partition graphs (context.enable_graph_collection moved?)")
        return
    added = ops.copy()
    added.subtract(plain_ops)
    print(f"{a.replicas} replicas: the step's partition graphs have {sum(plain_ops.values())} nodes plain, "
          f"{sum(ops.values())} instrumented ({sum(added.values()):+d})")
    print("  added by op type: " + ", ".join(f"{op} {n:+d}" for op, n in added.most_common() if n))
    print("  by device: " + ", ".join(f"{d} {plain_devices[d]} -> {devices[d]}" for d in sorted(devices)))
    pairs = added["_Send"]
    print(f"  {pairs:+d} send/receive pairs a step between devices added (each crossing edge, control edges included)")


if __name__ == "__main__":
    main()

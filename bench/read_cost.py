"""What the agent's reads cost right after a step call, where they happen.

The agent reads each replica's loss and its step accumulator on the training thread after a step
call (a run's first 256 calls within 1 % of the training, then at most every 0.25 s of training). This times those
reads right after a real MirroredStrategy step (4 logical CPUs; bench/_custom_loop.py, as
bench/overhead.py), beside the same reads in a loop with no training between them,
and one eager ``Identity`` as the floor of any eager op at that moment. Prints medians and the
1-minute load average.

    python bench/read_cost.py [--width 8] [--calls 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _custom_loop import custom_loop  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=8, help="hidden units (8: a tiny step; 448: ~20 ms here)")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--replicas", type=int, default=4)
    a = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from tensorflow.python import pywrap_tfe
    from tensorflow.python.eager import context

    from tpuwatch.agent import probes
    from tpuwatch.agent.runtime import Agent

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
    agent = Agent(Path(tempfile.mkdtemp()), "bench", sample_hz=4)
    patches = probes.install_all(agent, "bench", ["bench"], set())
    agent.start()
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(a.replicas)])
    plain_step, it = custom_loop(strategy, a.replicas, a.width)
    step = tf.function(plain_step)
    for _ in range(50):
        step(it)
    probe = agent.step_probe
    flags = next(f for f in probe.trace.flags.values() if "_name" in f and "training" in f)
    agent._disabled["steps"] = "bench"  # the calls below are not recorded: only the reads are timed
    fast, ctx, one = pywrap_tfe.TFE_Py_FastPathExecute, context.context(), tf.constant(1.0)
    perf = time.perf_counter
    timings: dict[str, list[float]] = {k: [] for k in ("identity", "accumulator", "losses", "both, no training")}
    load0 = os.getloadavg()[0]
    for _ in range(a.calls):
        step(it)
        t0 = perf()
        fast(ctx, "Identity", None, one, "T", tf.float32)
        t1 = perf()
        step(it)
        t2 = perf()
        probe.read_accumulator()
        t3 = perf()
        probe.loss_reader(flags)
        t4 = perf()
        timings["identity"].append(t1 - t0)
        timings["accumulator"].append(t3 - t2)
        timings["losses"].append(t4 - t3)
    for _ in range(a.calls):
        t0 = perf()
        probe.read_accumulator()
        probe.loss_reader(flags)
        timings["both, no training"].append(perf() - t0)
    print(f"width {a.width}, {a.replicas} replicas, {a.calls} calls; load {load0:.2f}->{os.getloadavg()[0]:.2f}")
    for name, values in timings.items():
        after = "" if "no training" in name else " right after a step"
        print(f"  {name + after:<40} median {statistics.median(values) * 1e6:7.1f} µs")
    patches.restore()
    agent.stop()


if __name__ == "__main__":
    main()

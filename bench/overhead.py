"""What the agent costs a training step: the same loop with and without it, interleaved call by call
in one process.

The loop is a MirroredStrategy custom loop over 4 logical CPU devices whose step function takes
the distributed iterator and calls ``next()`` inside (the in-graph input-wait, step-count and
per-replica-loss probes all run). Step functions are traced ``--instances`` times each without the
agent's patches (plain) and with them (instrumented, carrying the in-graph probes): two traces of
one graph differ in speed by more than the probes cost (bench/_instances.py), so one of each
cannot tell. Calls are interleaved in a random order each round, a few calls of each in a row:
each instrumented function with the agent on, each plain one with the agent's step probe switched
off (its call wrapper returns at its first line), and each instrumented one with it off (its
in-graph probes alone). Each call is timed on its own and medians are compared: on a shared, noisy
box a per-call median shrugs off the preemptions that make block averages swing by more than the
effect being measured. The agent's thread (recording, sampling) runs throughout, and its CPU time
is reported separately.

    python bench/overhead.py [--width 1024] [--rounds 150] [--big-rounds 8] [--run 8] [--instances 3]

Prints the ratio (instrumented / plain step time, medians over instances) and the added
microseconds per step, for a ~20 ms step (``--width``) and for a tiny step (where the fixed cost is
easiest to see); then the in-graph part beside the plain traces' own spread, and the Python part
(the agent on vs off for the same trace, so free of that spread).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _instances  # noqa: E402
from _custom_loop import custom_loop  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=1024, help="hidden units of the ~20 ms model")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--rounds", type=int, default=150, help="interleaved rounds of the tiny step (one call of each variant)")
    p.add_argument("--big-rounds", type=int, default=8, help="interleaved rounds of the ~20 ms step")
    p.add_argument("--run", type=int, default=8, help="calls of one variant in a row within a round")
    p.add_argument("--instances", type=int, default=3,
                   help="traces of each variant (two traces of one graph differ in speed: bench/_instances.py)")
    a = p.parse_args()

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
    from tpuwatch.agent import probes
    from tpuwatch.agent.runtime import Agent

    run_dir = Path(tempfile.mkdtemp(prefix="tpuwatch-bench-"))
    agent = Agent(run_dir, "bench", sample_hz=4)
    patches = probes.install_all(agent, "bench", ["bench"], set())
    agent.start()
    # Made with the agent installed, as in a script run by tpuwatch (it prepares its variables).
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(a.replicas)])
    agent_thread = next(t for t in __import__("threading").enumerate() if t.name == "tpuwatch-agent")

    for label, width, rounds in (("~20 ms step", a.width, a.big_rounds), ("tiny step", 8, a.rounds)):
        step, it = custom_loop(strategy, a.replicas, width)

        plains, instrumented = [], []
        for _ in range(a.instances):  # several traces of each: see bench/_instances.py
            patches.suspend()
            plains.append(tf.function(step))
            plains[-1](it)  # traced without the agent
            patches.resume()
            instrumented.append(tf.function(step))
            instrumented[-1](it)  # traced with it: carries the in-graph probes

        perf = time.perf_counter

        disabled = agent._disabled

        def once(fn, active: bool) -> float:
            # Toggled by the agent's own switch, not by re-patching classes per call (putting
            # the wrappers back on every call cost ~0.7 ms a call by itself): with "steps" off,
            # the call wrapper returns at its first line.
            if not active:
                disabled["steps"] = "bench"
            start = perf()
            fn(it)
            elapsed = perf() - start
            disabled.pop("steps", None)
            return elapsed

        variants = {}
        probe = agent.step_probe
        record = type(probe).record
        in_record = [0.0, 0]

        def timed_record(*args, **kwargs):  # the training thread's time in the agent after a call
            start = perf()
            try:
                return record(probe, *args, **kwargs)
            finally:
                in_record[0] += perf() - start
                in_record[1] += 1

        probe.record = timed_record
        for i in range(a.instances):
            variants[("agent", i)] = (instrumented[i], True)
            variants[("plain", i)] = (plains[i], False)
            variants[("graph", i)] = (instrumented[i], False)
        for _ in range(20):  # warm up every variant
            for fn, active in variants.values():
                once(fn, active)
        # Steady state: the agent reads every record of a run's first 256 (see steps.READ_ALL_FIRST).
        agent.step_probe._read_all_left = 0
        in_record[:] = [0.0, 0]  # the warm-up's records were read every call: not the steady state
        times: dict[tuple[str, int], list[float]] = {key: [] for key in variants}
        proc = psutil.Process()
        cpu0 = _thread_cpu(proc, agent_thread.native_id)
        steps0 = agent.global_step
        keys = list(variants)
        rng = random.Random(0)
        load0 = os.getloadavg()[0]
        for _ in range(rounds):
            rng.shuffle(keys)
            for key in keys:
                # A few calls in a row: the agent's reads keep their real cadence (at most one
                # every 0.25 s of training), which single interleaved calls would not.
                times[key].extend(once(*variants[key]) for _ in range(a.run))
        agent.flush()
        record_s, records = in_record[0], in_record[1]
        in_record[:] = [0.0, 0]
        agent_cpu = _thread_cpu(proc, agent_thread.native_id) - cpu0
        recorded = agent.global_step - steps0
        med = _instances.medians(times)
        plain_s, agent_s, graph_s = (_instances.over_instances(med, v) for v in ("plain", "agent", "graph"))
        python_s = _instances.paired(med, "agent", "graph")
        print(f"{label:>12}: plain {plain_s * 1e3:8.3f} ms/step   with agent {agent_s * 1e3:8.3f} ms/step   "
              f"ratio {agent_s / plain_s:6.4f}   added {(agent_s - plain_s) * 1e6:+7.1f} µs/step   "
              f"(medians over {a.instances} traces of each, {rounds} interleaved runs of {a.run} calls; "
              f"load {load0:.2f}->{os.getloadavg()[0]:.2f})")
        print(f"{'':>12}  in-graph probes {(graph_s - plain_s) * 1e6:+7.1f} µs/step (plain traces alone spread "
              f"{_instances.spread(med, 'plain') * 1e6:.1f} µs: differences below that mean nothing), "
              f"Python side {python_s * 1e6:+7.1f} µs/step (same trace, agent on vs off);   "
              f"agent thread {agent_cpu / max(recorded, 1) * 1e6:6.1f} µs CPU/step ({recorded} steps recorded)")
        print(f"{'':>12}  measured directly: the training thread spends {record_s / max(records, 1) * 1e6:.1f} µs "
              f"a call in the agent's record (reads of losses and the accumulator included)")
        del probe.record
    patches.resume()
    patches.restore()
    agent.stop()


def _thread_cpu(proc: psutil.Process, tid: int) -> float:
    for t in proc.threads():
        if t.id == tid:
            return t.user_time + t.system_time
    return 0.0


if __name__ == "__main__":
    main()

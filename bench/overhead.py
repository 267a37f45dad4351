"""What the agent costs a training step: the same loop with and without it, interleaved call by call
in one process.

The loop is a MirroredStrategy custom loop over 4 logical CPU devices whose step function takes
the distributed iterator and calls ``next()`` inside (the in-graph input-wait, step-count and
per-replica-loss probes all run). Step functions are traced ``--instances`` times each without the
agent's patches (plain) and with them (instrumented, carrying the in-graph probes): two traces of
one graph differ in speed by more than the probes cost (bench/_instances.py), so one of each
cannot tell, and the median over a few still moves by about that much from set to set: the
default is ten traces of each, where three gave A/A floors of 17-99 µs at the tiny step (the
floor, below, is what tells whether there were enough). Calls are interleaved in a random order
each round, a few calls of each in a row: each instrumented function with the agent on, each
plain one with the agent's step probe switched off (its call wrapper returns at its first line),
and each instrumented one with it off (its in-graph probes alone). Each call is timed on its own
and medians are compared: on a shared, noisy box a per-call median shrugs off the preemptions
that make block averages swing by more than the effect being measured. The agent's thread
(recording, sampling) runs throughout, and its CPU time is reported separately. The auto-profile
is off (``--auto-profile`` keeps it on): this loop waits for its input, so it would capture
profiles, a phase of its own with its own bench (``bench/auto_profile_cost.py``).

    python bench/overhead.py [--width N] [--rounds 50] [--big-rounds 8] [--run 8] [--instances 10]

Prints, for a ~20 ms step and for a tiny step (where the fixed cost is easiest to see). The ~20 ms
step's width is sized on the box it runs on (plain steps timed from 1024 hidden units, the width
scaled by the square root of the time, at most twice): the same 1024 units took 21-26 ms a step on
one 2-core box and 60 ms on another. ``--width`` fixes it instead.

- the A/B: the ratio (instrumented / plain step time, medians over instances) and the added
  microseconds per step;
- its own A/A floor, by the same procedure: a second set of plain traces against the first, and a
  second set of instrumented traces (agent on) against the first, interleaved in the same rounds.
  A difference between two sets of the same thing is noise (trace-to-trace and box); an A/B
  smaller than it says nothing;
- the in-graph part (instrumented traces with the agent off) and the Python part (the agent on vs
  off for the same trace, so free of the trace spread);
- the Python time per call timed directly, in agent-on calls after the rounds (timing ``record``
  inside the A/B's calls lengthened them): each instrumented call's wall time minus the time the
  agent's wrapper measured inside TensorFlow's own ``__call__`` (wrapper, bookkeeping and
  ``record`` together), and ``record`` alone;
- the ops the probes add to the step's graph (instrumented minus plain trace, nested functions
  included), by type;
- the training thread's CPU in the agent's Python a call (the call wrapper and record with
  TensorFlow's call replaced by nothing, plus the periodic reads' share), and the agent thread's
  CPU a step over a run of agent-on calls (judged against 20 µs), beside what the same clock
  charged a bare thread that only woke at the sample rate meanwhile (on a virtual machine a wake
  itself can be charged hundreds of µs: ``_IdleThread``), the part of it spent in garbage
  collections that fell to that thread, and the kinds of messages it recorded meanwhile (steps and
  samples aside: what else it did);
- a verdict on the 50 µs budget on this box: *missed* when the training thread's CPU in the
  agent's Python alone (a lower bound of the cost) is over it; otherwise *unresolved* when other processes
  used more than a tenth of the box's CPU during the measurement (their work, not the agent, then
  decides the figures); otherwise *missed* when the A/B minus its floor is over the budget, *met* when the A/B
  plus its floor is within it, *unresolved* in between (the floor is wider than the distance to
  the budget).
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _instances  # noqa: E402
from _custom_loop import custom_loop  # noqa: E402

BUDGET_S = 50e-6  # the agent's budget per step (README, docs/performance.md)
THREAD_BUDGET_S = 20e-6  # the agent thread's CPU per step at the tiny step
BUSY_SHARE = 0.10  # other processes' share of the box's CPU above which no verdict is given


def verdict(added_s: float, floor_s: float, python_s: float, others_share: float) -> str:
    """MET / MISSED / UNRESOLVED for the budget, given the A/B, its A/A floor, the directly timed
    Python part (a lower bound of the cost: the in-graph part is not negative) and the share of
    the box's CPU that other processes used while it was measured."""
    if python_s > BUDGET_S:
        return "MISSED (the Python part alone)"
    if others_share > BUSY_SHARE:
        return f"UNRESOLVED (other processes used {others_share:.0%} of the box's CPU meanwhile)"
    if added_s - floor_s > BUDGET_S:
        return "MISSED"
    if added_s + floor_s <= BUDGET_S:
        return "MET"
    return "UNRESOLVED (the A/A floor is wider than the distance to the budget)"


def sized_width(strategy, replicas: int, patches, target_s: float = 20e-3) -> int:
    """Hidden units for a plain step of about ``target_s`` on this box: from 1024, scaled by the
    square root of the time (the hidden layer's work grows with its square), at most twice."""
    import tensorflow as tf

    width = 1024
    for _ in range(2):
        step, it = custom_loop(strategy, replicas, width)
        patches.suspend()
        try:
            fn = tf.function(step)
            for _ in range(5):
                fn(it)
            times = []
            for _ in range(15):
                start = time.perf_counter()
                fn(it)
                times.append(time.perf_counter() - start)
        finally:
            patches.resume()
        sized = min(4096, max(64, int(round(width * (target_s / statistics.median(times)) ** 0.5 / 32)) * 32))
        if abs(sized - width) <= width // 10:
            break
        width = sized
    return width


def graph_ops(fn, it) -> collections.Counter:
    """Op types of ``fn``'s trace for ``it``, the functions it calls included."""
    graph = fn.get_concrete_function(it).graph.as_graph_def()
    ops = collections.Counter(node.op for node in graph.node)
    for f in graph.library.function:
        ops.update(node.op for node in f.node_def)
    return ops


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=None,
                   help="hidden units of the ~20 ms model (default: sized to a ~20 ms plain step on this box)")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--rounds", type=int, default=50, help="interleaved rounds of the tiny step (one call of each variant)")
    p.add_argument("--big-rounds", type=int, default=8, help="interleaved rounds of the ~20 ms step")
    p.add_argument("--run", type=int, default=8, help="calls of one variant in a row within a round")
    p.add_argument("--thread-calls", type=int, default=2000,
                   help="agent-on calls in a row after the rounds, for the agent thread's CPU a step")
    p.add_argument("--instances", type=int, default=10,
                   help="traces of each variant (two traces of one graph differ in speed: bench/_instances.py); "
                        "the floor narrows with more of them")
    p.add_argument("--auto-profile", action="store_true",
                   help="keep the auto-profile on: its captures (this loop waits for its input) then fall inside "
                        "the steady state measured here; their cost is bench/auto_profile_cost.py's")
    a = p.parse_args()

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * a.replicas)
    from tpuwatch.agent import probes
    from tpuwatch.agent.runtime import Agent

    run_dir = Path(tempfile.mkdtemp(prefix="tpuwatch-bench-"))
    agent = Agent(run_dir, "bench", sample_hz=4)
    # The steady state: no auto-profile capture (a phase of its own, at most 3 a run)
    patches = probes.install_all(agent, "bench", ["bench"], set() if a.auto_profile else {"auto_profile"})
    agent.start()
    # Made with the agent installed, as in a script run by tpuwatch (it prepares its variables).
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(a.replicas)])
    agent_thread = next(t for t in threading.enumerate() if t.name == "tpuwatch-agent")

    big_width = a.width or sized_width(strategy, a.replicas, patches)
    for label, width, rounds in (("~20 ms step", big_width, a.big_rounds), ("tiny step", 8, a.rounds)):
        step, it = custom_loop(strategy, a.replicas, width)

        # Two sets of each, traced alike: the second set is the A/A floor's (bench/_instances.py).
        plains, plains2, instrumented, instrumented2 = [], [], [], []
        for _ in range(a.instances):  # several traces of each: see bench/_instances.py
            for plain_set, instrumented_set in ((plains, instrumented), (plains2, instrumented2)):
                patches.suspend()
                plain_set.append(tf.function(step))
                plain_set[-1](it)  # traced without the agent
                patches.resume()
                instrumented_set.append(tf.function(step))
                instrumented_set[-1](it)  # traced with it: carries the in-graph probes
        try:
            patches.suspend()
            plain_ops = graph_ops(plains[0], it)
            patches.resume()
            added_ops = graph_ops(instrumented[0], it)
            added_ops.subtract(plain_ops)
            captured = added_ops.pop("Placeholder", 0)  # the probes' variables, captured as inputs
            ops_text = (f"{sum(added_ops.values()):+d} ops/step ("
                        + ", ".join(f"{op} {n:+d}" for op, n in added_ops.most_common() if n)
                        + f"), {captured:+d} captured variable handles")
        except Exception as e:  # a private graph API moved: the timings still stand
            patches.resume()
            ops_text = f"not counted ({type(e).__name__}: {e})"

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
        record_calls: list[float] = []  # per agent call: the training thread's time in record
        record_cpu: list[float] = []  # per agent call: the training thread's CPU in record
        inside_tf = [0.0]  # the last call's time inside TensorFlow's __call__, as the wrapper timed it
        thread_time = time.thread_time

        def timed_record(flags, call_s, *args, **kwargs):  # the training thread's time in record
            inside_tf[0] = call_s
            start, cpu = perf(), thread_time()
            try:
                return record(probe, flags, call_s, *args, **kwargs)
            finally:
                record_cpu.append(thread_time() - cpu)
                record_calls.append(perf() - start)

        python_calls: list[float] = []  # per agent call: its wall time minus its time inside TF

        def once_agent(fn) -> float:
            inside_tf[0] = float("nan")
            elapsed = once(fn, True)
            python_calls.append(elapsed - inside_tf[0])
            return elapsed

        for i in range(a.instances):
            variants[("agent", i)] = (instrumented[i], True)
            variants[("agent2", i)] = (instrumented2[i], True)
            variants[("plain", i)] = (plains[i], False)
            variants[("plain2", i)] = (plains2[i], False)
            variants[("graph", i)] = (instrumented[i], False)
        for _ in range(20):  # warm up every variant
            for fn, active in variants.values():
                once(fn, active)
        # Steady state: the agent reads every record of a run's first 256 (see read_pacer.READ_ALL_FIRST).
        agent.step_probe.pacer.read_all_left = 0
        times: dict[tuple[str, int], list[float]] = {key: [] for key in variants}
        proc = psutil.Process()
        cpu0 = _thread_cpu(agent_thread)
        steps0 = agent.global_step
        keys = list(variants)
        rng = random.Random(0)
        load0 = os.getloadavg()[0]
        cores = os.cpu_count() or 1
        own0 = proc.cpu_times()
        since = (_busy_s(psutil.cpu_times()), own0.user + own0.system, time.monotonic())
        for _ in range(rounds):
            rng.shuffle(keys)
            for key in keys:
                # A few calls in a row: the agent's reads keep their real cadence (at most one
                # every 0.25 s of training), which single interleaved calls would not.
                fn, active = variants[key]
                times[key].extend(once(fn, active) for _ in range(a.run))
        others_share = _others_share(proc, since, cores)
        agent.flush()
        interleaved_cpu = _thread_cpu(agent_thread) - cpu0
        interleaved_steps = agent.global_step - steps0
        # The training thread's time in the agent's Python, timed around record and TensorFlow's
        # call, in agent-on calls of their own: the timing (two clock reads of each kind, two
        # appends a call) stays out of the A/B above, whose agent-on calls it lengthened.
        probe.record = timed_record
        for _ in range(max(rounds // 2, 1)):
            for i in rng.sample(range(a.instances), a.instances):
                for _ in range(a.run):
                    once_agent(instrumented[i])
        del probe.record
        agent.flush()  # their records drained before the agent thread's run below
        # The agent thread's CPU a step in a run of agent-on calls (in the interleaved rounds its
        # per-second work, sampling and drains, went on through the other variants' calls too).
        collections_run = _GcOnThread(agent_thread.ident)
        gc.callbacks.append(collections_run)
        wall0 = time.time()
        idle = _IdleThread(1.0 / agent.sample_interval_s)  # what the clock charges a thread that only wakes
        cpu0, steps0, idle0 = _thread_cpu(agent_thread), agent.global_step, idle.cpu()
        for _ in range(a.thread_calls if width == 8 else max(a.thread_calls // 20, 20)):
            instrumented[0](it)
        agent.flush()
        agent_cpu = _thread_cpu(agent_thread) - cpu0
        idle_cpu = idle.cpu() - idle0
        idle.stop()
        recorded = agent.global_step - steps0
        gc.callbacks.remove(collections_run)
        written = _kinds_written(run_dir, wall0)
        # The training thread's CPU in the agent's Python a call: the call wrapper and record with
        # TensorFlow's call replaced by nothing (no read due), plus the periodic reads' share
        # (record's mean CPU over its median, from the timed agent-on calls). Its wall time, above,
        # also holds the time TensorFlow's own threads (tf.data refilling its buffers) had the
        # core meanwhile, which they would have taken in a plain run too.
        bare = probe.make_call_wrapper(lambda fn, *args, **kwargs: None)
        probe.pacer.every_s, every_s = float("inf"), probe.pacer.every_s
        cpu = thread_time()
        for _ in range(2000):
            bare(instrumented[0], it)
        bare_cpu = (thread_time() - cpu) / 2000
        probe.pacer.every_s = every_s
        reads_cpu = statistics.fmean(record_cpu) - statistics.median(record_cpu) if record_cpu else 0.0
        python_cpu_s = bare_cpu + max(reads_cpu, 0.0)
        med = _instances.medians(times)
        plain_s, agent_s, graph_s, plain2_s, agent2_s = (
            _instances.over_instances(med, v) for v in ("plain", "agent", "graph", "plain2", "agent2"))
        python_s = _instances.paired(med, "agent", "graph")
        added_s = agent_s - plain_s
        aa_plain_s, aa_agent_s = plain2_s - plain_s, agent2_s - agent_s
        floor_s = max(abs(aa_plain_s), abs(aa_agent_s))
        python_direct_s = statistics.median(python_calls)
        in_record = (statistics.median(record_calls), statistics.fmean(record_calls)) if record_calls else (0.0, 0.0)
        print(f"{label:>12}: width {width}, plain {plain_s * 1e3:8.3f} ms/step   with agent {agent_s * 1e3:8.3f} ms/step   "
              f"ratio {agent_s / plain_s:6.4f}   added {added_s * 1e6:+7.1f} µs/step   "
              f"(medians over {a.instances} traces of each, {rounds} interleaved runs of {a.run} calls; "
              f"load {load0:.2f}->{os.getloadavg()[0]:.2f})")
        print(f"{'':>12}  A/A floor, same procedure: plain vs plain {aa_plain_s * 1e6:+7.1f} µs/step "
              f"(ratio {plain2_s / plain_s:6.4f}), agent vs agent {aa_agent_s * 1e6:+7.1f} µs/step "
              f"(ratio {agent2_s / agent_s:6.4f}): floor {floor_s * 1e6:.1f} µs")
        print(f"{'':>12}  in-graph probes {(graph_s - plain_s) * 1e6:+7.1f} µs/step (plain traces alone spread "
              f"{_instances.spread(med, 'plain') * 1e6:.1f} µs: differences below that mean nothing), "
              f"Python side {python_s * 1e6:+7.1f} µs/step (same trace, agent on vs off);   "
              f"agent thread {interleaved_cpu / max(interleaved_steps, 1) * 1e6:6.1f} µs CPU/recorded step in the "
              f"interleaved rounds")
        print(f"{'':>12}  measured directly: the training thread spends {python_direct_s * 1e6:.1f} µs a call "
              f"in the agent's Python (median; mean {statistics.fmean(python_calls) * 1e6:.1f} µs; "
              f"{len(python_calls)} calls: wall time minus time inside TF), in record median "
              f"{in_record[0] * 1e6:.1f} µs, mean {in_record[1] * 1e6:.1f} µs (its periodic reads of losses "
              f"and the accumulator are in the mean)")
        print(f"{'':>12}  the training thread's CPU in the agent's Python: {python_cpu_s * 1e6:.1f} µs a call "
              f"(call wrapper and record {bare_cpu * 1e6:.1f} µs, the periodic reads' share "
              f"{max(reads_cpu, 0.0) * 1e6:.1f} µs)")
        print(f"{'':>12}  in-graph ops the probes add to the function's graph: {ops_text} (what TensorFlow "
              f"runs, its graph split by device with send/receive pairs between them and Grappler's "
              f"rewrites, differs: bench/ingraph_ops.py counts that)")
        thread_s = agent_cpu / max(recorded, 1)
        print(f"{'':>12}  agent thread: {thread_s * 1e6:.1f} µs CPU a step: "
              f"{'MET' if thread_s <= THREAD_BUDGET_S else 'MISSED'} (<= {THREAD_BUDGET_S * 1e6:.0f} µs); "
              f"a bare thread beside it waking at the agent's sample rate and doing nothing was charged "
              f"{idle_cpu / max(recorded, 1) * 1e6:.1f} µs a step by the same clock (the host's share: see "
              f"_IdleThread); "
              f"of it in the process's garbage collections that fell to it "
              f"{collections_run.cpu_s / max(recorded, 1) * 1e6:.1f} µs ({collections_run.describe()}); "
              f"what it wrote meanwhile: {', '.join(f'{k} {n}' for k, n in written.most_common()) or 'nothing'}")
        print(f"{'':>12}  verdict on this box: {verdict(added_s, floor_s, python_cpu_s, others_share)}: "
              f"<= {BUDGET_S * 1e6:.0f} µs/step (added {added_s * 1e6:+.1f} ± {floor_s * 1e6:.1f} µs, Python alone "
              f"{python_cpu_s * 1e6:.1f} µs of CPU; other processes {others_share:.0%} of {cores} cores, "
              f"load {os.getloadavg()[0]:.2f})")
    patches.resume()
    patches.restore()
    agent.stop()


def _busy_s(t) -> float:
    return t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


def _others_share(proc: psutil.Process, since: tuple, cores: int) -> float:
    """Share of the box's CPU (all cores) used by other processes since ``since``."""
    sys0, own0, wall0 = since
    own = proc.cpu_times()
    others = (_busy_s(psutil.cpu_times()) - sys0) - ((own.user + own.system) - own0)
    return max(0.0, others) / max((time.monotonic() - wall0) * cores, 1e-9)


class _GcOnThread:
    """The garbage collections one thread ran, and their CPU. Python runs a collection on whichever
    thread's allocation crosses the threshold, so a full one (every object of a TensorFlow process:
    tens of milliseconds) lands on the agent's thread now and then, counted in its CPU."""

    def __init__(self, ident: int | None) -> None:
        self.ident = ident
        self.cpu_s = 0.0
        self.by_generation: collections.Counter[int] = collections.Counter()
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if threading.get_ident() != self.ident:
            return
        if phase == "start":
            self._start = time.thread_time()  # the collecting thread's own CPU clock
        else:
            self.cpu_s += time.thread_time() - self._start
            self.by_generation[info["generation"]] += 1

    def describe(self) -> str:
        return ", ".join(f"{n} of generation {g}" for g, n in sorted(self.by_generation.items())) or "none"


class _IdleThread:
    """A thread that wakes ``hz`` times a second and does nothing else: what a thread's CPU clock
    charges for the wakes alone. On the virtual machine these benches ran on (2026-11-30, a
    ``haltpoll`` idle driver), a thread that only slept and woke was charged 2.4-2.9 ms of CPU a
    wake at 4 a second and ~0.6 ms at 25 (its CPU clock, /proc's ticks and schedstat agreeing),
    90-125 µs a wake while training kept both cores busy: time the host, not the thread, spent.
    The agent thread's figure holds that charge for its own wakes too."""

    def __init__(self, hz: float) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(1.0 / hz,), name="bench-idle", daemon=True)
        self._thread.start()

    def _run(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            pass

    def cpu(self) -> float:
        return _thread_cpu(self._thread)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _kinds_written(run_dir: Path, since: float) -> collections.Counter[str]:
    """Kinds of the messages the agent recorded since ``since`` (wall clock), steps and samples left out."""
    kinds: collections.Counter[str] = collections.Counter()
    try:
        lines = (run_dir / "events.jsonl").read_text().splitlines()
    except OSError:
        return kinds
    for line in lines:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("t", 0) >= since and message.get("kind") not in ("step", "host_sample", "device_sample"):
            kinds[message.get("kind", "?")] += 1
    return kinds


def _thread_cpu(thread) -> float:
    """``thread``'s CPU time (seconds), from its own CPU clock: nanoseconds, where the per-thread
    figures in /proc count clock ticks (10 ms: one tick over 2,000 steps reads as 5 µs a step)."""
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


if __name__ == "__main__":
    main()

"""What a run's first records cost next to the rest: the TensorFlow tutorial's custom loop
(``bench/_tutorial_loop.py``), in one process and on one trace of its step, at 1, 2 and 4 replicas.

For a run's first records the agent reads every replica's loss and the in-graph accumulator after
each step, while those reads cost at most a hundredth of the training (``agent/read_pacer.py``);
after them, at most every 0.25 s of training. ``bench/short_run.py`` compares whole runs, a process
against a process, and single runs of one variant swing by 10-25 % here: its floors are wider
than the 2 % target. Here the variants share one process and one trace of the step (traced with
the agent, so its in-graph probes run in every variant: what they cost is ``bench/overhead.py``'s
figure), so what differs is only the agent's Python on the training thread and its reads:

- ``first``: the agent on, with a fresh pacer: every record of the epoch is one of a run's first;
- ``steady``: the agent on, past the first records (a fresh pacer that reads at the steady pace);
- ``every``: the agent on, reading after every call (as ``TPUWATCH_LOSS_EVERY_S=0``): against
  ``steady``, what a read costs the training in all over its own time, which the first records'
  budget counts (``READ_COST_FACTOR``);
- ``off`` and ``off2``: the agent's call wrapper and fetch timing switched off; two sets, whose
  difference is the A/A floor.

The first variant's epoch runs first (the agent learns the step function at its first call).

Each variant runs whole epochs of ``--steps`` steps (``for batch in dist_dataset``, the step call,
and the ``float(loss)`` the tutorial logs), one epoch of each in a shuffled order each round; an
epoch's figures are its median and mean iteration time (its first left out: the iterator's
start), a variant's the median of them over its epochs. An iteration is the fetch, the call and
the ``float``, where ``short_run.py``'s loop times the call alone: the same added time is a
smaller share of it. Each replica count runs in a process of its own (logical
devices are fixed when TensorFlow starts).

    python bench/first_records.py [--rounds 8] [--replicas 1,2,4] [--steps 100]

Prints, per replica count, by the median and by the mean iteration: each variant's figure, first /
off and steady / off with the A/A floor (off2 / off), and a verdict on first / off <= 1.02 by the
rule of ``bench/short_run.py``; what the reads of the last ``first`` epoch took, against the
budget the pacer holds them to (their time times ``READ_COST_FACTOR`` within ``READ_SHARE`` of the
training after the epoch's first call); and, for ``first``, ``steady`` and ``every``, the means
over their epochs of the reads a record and their time, the agent's record (its reads in it) and
the step call alone: what reading every record costs in all (``every``'s mean iteration over
``steady``'s) over what its reads took beyond ``steady``'s, the figure ``READ_COST_FACTOR`` stands
for.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from short_run import TARGET, verdict  # noqa: E402

VARIANTS = ("first", "steady", "every", "off", "off2")


def one(replicas: int, rounds: int, steps: int) -> None:
    os.environ.pop("TPUWATCH_LOSS_EVERY_S", None)  # the default pacing, as users run it
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    from _tutorial_loop import build

    from tpuwatch.agent import probes
    from tpuwatch.agent.read_pacer import READ_COST_FACTOR, READ_SHARE, ReadPacer
    from tpuwatch.agent.runtime import Agent

    agent = Agent(Path(tempfile.mkdtemp(prefix="tpuwatch-bench-")), "bench", sample_hz=4)
    # no auto-profile: a slowdown's capture (a phase of its own) would fall in one variant's epochs
    patches = probes.install_all(agent, "bench", ["bench"], {"auto_profile"})
    agent.start()
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    dist_dataset, step = build(strategy, steps)
    train_step = tf.function(step)
    probe, disabled, perf = agent.step_probe, agent._disabled, time.perf_counter
    first_pacer = [probe.pacer]  # the last first-records epoch's
    # what an epoch's records, reads and calls took: [records, record s, reads, read s]
    tally = [0, 0.0, 0, 0.0]
    record, read_losses, read_acc = probe.record, probe.loss_reader, probe.read_accumulator

    def timed_record(*args: object, **kwargs: object) -> None:
        began = perf()
        record(*args, **kwargs)
        tally[0] += 1
        tally[1] += perf() - began

    def timed_read(read: object) -> object:
        def reader(*args: object) -> object:
            began = perf()
            try:
                return read(*args)  # type: ignore[operator]
            finally:
                tally[2] += 1
                tally[3] += perf() - began
        return reader

    probe.record = timed_record
    probe.loss_reader = timed_read(read_losses)
    if read_acc is not None:
        probe.read_accumulator = timed_read(read_acc)
    parts: dict[str, list[tuple[float, float, float, float, float]]] = {"first": [], "steady": [], "every": []}

    def epoch(variant: str) -> tuple[float, float]:
        if variant.startswith("off"):
            disabled["steps"] = disabled["input_wait"] = "bench"
        else:
            probe.pacer = ReadPacer(0.0, 0) if variant == "every" else ReadPacer.from_settings()
            probe._steady = None
            if variant == "steady":
                probe.pacer.read_all_left = 0
            elif variant == "first":
                first_pacer[0] = probe.pacer
        times, calls = [], []
        tally[:] = [0, 0.0, 0, 0.0]
        last = perf()
        for i, batch in enumerate(dist_dataset):
            began = perf()
            loss = train_step(batch)
            calls.append(perf() - began)  # the call and its record
            float(loss)
            now = perf()
            if i:
                times.append(now - last)
            last = now
        disabled.pop("steps", None)
        disabled.pop("input_wait", None)
        if variant in parts and tally[0]:
            n = tally[0]
            parts[variant].append((statistics.fmean(times), tally[2] / n, tally[3] / n, tally[1] / n,
                                   statistics.fmean(calls[1:]) - tally[1] / n))
        return statistics.median(times), statistics.fmean(times)

    for variant in VARIANTS:  # warm-up: the trace, and every variant once
        epoch(variant)
    figures: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    order = list(VARIANTS)
    rng = random.Random(replicas)
    load0 = os.getloadavg()[0]
    for _ in range(rounds):
        rng.shuffle(order)
        for variant in order:
            figures[variant].append(epoch(variant))
    load = f"{rounds} epochs of {steps} steps each; load {load0:.2f}->{os.getloadavg()[0]:.2f}"
    for i, what in enumerate(("median", "mean")):
        # the median iteration, as short_run.py times a run; the mean, which every read is in (a read
        # on more than half the records moves the median by a whole read, on fewer not at all)
        fig = {v: statistics.median(f[i] for f in figs) for v, figs in figures.items()}
        floor = fig["off2"] / fig["off"]
        ratio = fig["first"] / fig["off"]
        print(f"{replicas} replica(s), {what} iteration: first {fig['first'] * 1e3:.3f} ms, steady "
              f"{fig['steady'] * 1e3:.3f} ms, off {fig['off'] * 1e3:.3f} ms, off2 {fig['off2'] * 1e3:.3f} ms; "
              f"first/off {ratio:.4f}, steady/off {fig['steady'] / fig['off']:.4f}, A/A floor off2/off {floor:.4f} "
              f"({load}): {verdict(ratio, floor)} (target first/off <= {TARGET})", flush=True)
    reads = first_pacer[0]
    budget = READ_SHARE * (reads.trained_s - (reads._first_s or 0.0))
    print(f"{'':>12}the last first-records epoch: its reads took {reads._spent_s * 1e3:.1f} ms of "
          f"{reads.trained_s * 1e3:.0f} ms of training; counted at {READ_COST_FACTOR:g}x, "
          f"{READ_COST_FACTOR * reads._spent_s * 1e3:.1f} ms of a {budget * 1e3:.1f} ms budget", flush=True)
    mean = {v: [statistics.fmean(col) for col in zip(*rows)] for v, rows in parts.items() if rows}
    if len(mean) == 3:
        for v in ("first", "steady", "every"):
            it, nreads, read_s, rec_s, call_s = mean[v]
            print(f"{'':>12}{v}: {nreads:.2f} reads a record, {read_s * 1e6:.0f} us of reads; the record "
                  f"{rec_s * 1e6:.0f} us; the call alone {call_s * 1e3:.3f} ms; the iteration {it * 1e3:.3f} ms",
                  flush=True)
        extra_reads = mean["every"][2] - mean["steady"][2]
        extra = mean["every"][0] - mean["steady"][0]
        if extra_reads > 0:
            print(f"{'':>12}reading every record cost {extra * 1e6:.0f} us a record over steady's for "
                  f"{extra_reads * 1e6:.0f} us more of reads: {extra / extra_reads:.1f}x the reads' time "
                  f"(READ_COST_FACTOR {READ_COST_FACTOR:g})", flush=True)
    patches.restore()
    agent.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=8, help="epochs of each variant")
    p.add_argument("--replicas", default="1,2,4")
    p.add_argument("--steps", type=int, default=100, help="steps an epoch")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: this replica count
    a = p.parse_args()
    if a.one:
        one(a.one, a.rounds, a.steps)
        return
    for replicas in a.replicas.split(","):
        subprocess.run([sys.executable, __file__, "--one", replicas, "--rounds", str(a.rounds),
                        "--steps", str(a.steps)], check=True, timeout=1800)


if __name__ == "__main__":
    main()

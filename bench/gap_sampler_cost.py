"""What the gap sampler costs: one look at the training thread's stack from another thread
(``sys._current_frames``, the walk to the script's innermost frame, the line's role and kind),
while that thread runs Python ``--depth`` frames deep (a Keras callback inside ``fit`` is ~60).
The sampler runs on the agent's thread 20 times a second while its looks find the training
thread between steps, else at the agent's rate (4 by default), so its CPU per second is the
per-sample time plus a wake of the agent's thread (also timed: a thread waiting on an Event with
a timeout, its CPU per wake from its own CPU clock) times the rate; nothing runs on the training
thread. Also the training thread's own loop with the sampler beside it at 20 Hz vs without (its
only cost there: the GIL, ~the per-sample time, 20 times a second). Prints numbers; no asserts.

    python bench/gap_sampler_cost.py [--samples 2000] [--depth 60]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _deep(depth: int, stop: threading.Event) -> None:
    if depth > 0:
        _deep(depth - 1, stop)
        return
    while not stop.is_set():
        sum(i * i for i in range(2000))  # the script's Python between steps


def _work(rounds: int) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        sum(i * i for i in range(2000))
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--depth", type=int, default=60)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    from tpuwatch.agent.gap_sampler import GapSampler
    from tpuwatch.agent.runtime import Agent

    with tempfile.TemporaryDirectory() as d:
        agent = Agent(run_dir=d, run_id="bench")
        stop = threading.Event()
        t = threading.Thread(target=_deep, args=(args.depth, stop), daemon=True)
        t.start()
        time.sleep(0.2)
        steps = itertools.count()
        sampler = GapSampler(agent, state=lambda: "gap", step=lambda: next(steps), thread=t.ident)
        per_sample = []
        for _ in range(args.repeats):
            start = time.thread_time()
            for _ in range(args.samples):
                sampler.sample()
            per_sample.append((time.thread_time() - start) / args.samples)
        stop.set()
        t.join()
        us = statistics.median(per_sample) * 1e6
        print(f"one sample ({args.depth} frames deep): {us:.1f} us of CPU (median of {args.repeats}; "
              f"min {min(per_sample) * 1e6:.1f}, max {max(per_sample) * 1e6:.1f})")
        for hz in (4, 20):
            print(f"  at {hz:2d} Hz: {us * hz / 1e4:.3f} % of a core")

        # the training thread's loop, alone and with the sampler at 20 Hz on another thread
        rounds = 400
        stop = threading.Event()

        def sampling() -> None:
            main_ident = threading.main_thread().ident
            s = GapSampler(agent, state=lambda: "gap", step=lambda: next(steps), thread=main_ident)
            while not stop.wait(0.05):
                s.sample()

        alone, beside = [], []
        for _ in range(args.repeats):
            alone.append(_work(rounds))
            stop.clear()
            th = threading.Thread(target=sampling, daemon=True)
            th.start()
            beside.append(_work(rounds))
            stop.set()
            th.join()
        ratio = statistics.median(beside) / statistics.median(alone)
        print(f"training thread's loop with the sampler at 20 Hz beside it: {ratio:.3f}x alone "
              f"(median of {args.repeats}; {statistics.median(alone) * 1e3:.0f} ms alone)")
        agent.stop()
    wake = _wake_cpu_s(0.05, 3.0)
    print(f"a wake of a thread waiting with a timeout: {wake * 1e6:.1f} us of CPU; with a look, at 20 Hz "
          f"{(wake + us / 1e6) * 20 * 100:.3f} % of a core, at 4 Hz {(wake + us / 1e6) * 4 * 100:.3f} %")
    print(f"load average {os.getloadavg()[0]:.2f}")


def _wake_cpu_s(period: float, seconds: float) -> float:
    """CPU a wake of a thread that waits on an Event with a timeout ``period`` (its own CPU clock,
    as bench/overhead.py reads the agent thread's)."""
    stop, event, wakes = threading.Event(), threading.Event(), [0]

    def loop() -> None:
        while not stop.is_set():
            event.wait(period)
            wakes[0] += 1

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    time.sleep(0.2)

    clock = time.pthread_getcpuclockid(t.ident)  # type: ignore[arg-type]  (started: it has one)
    c0, n0 = time.clock_gettime(clock), wakes[0]
    time.sleep(seconds)
    c1, n1 = time.clock_gettime(clock), wakes[0]
    stop.set()
    event.set()
    t.join()
    return (c1 - c0) / max(1, n1 - n0)


if __name__ == "__main__":
    main()

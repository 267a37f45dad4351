"""What the agent costs a short run: the TensorFlow tutorial's custom loop (``bench/_tutorial_loop.py``:
300 steps over 3 epochs) run plain and under the agent, at 1, 2 and 4 replicas.

A short run is what a user trying tpuwatch runs first, and its first records are where the agent
does the most per step (it reads losses and the in-graph wait more often then: agent/read_pacer.py).
Each run is a process of its own; the script times its own steps and prints the median step time
within epochs (boundaries left out: TensorFlow's iterator teardown pauses 0-60 s at random, in
plain runs too). Runs are interleaved (plain, agent, plain, agent, ... in a shuffled order each
round) and their medians compared; the A/A floor is the same comparison between the plain runs'
two halves (every other plain run against the rest).

    python bench/short_run.py [--rounds 4] [--replicas 1,2,4] [--steps 300]

Prints, per replica count: the plain and agent medians of the per-run medians, their ratio, the
A/A floor's ratio, and a verdict on the target (agent / plain <= 1.02), by the rule of
bench/overhead.py: MET when the ratio plus the floor's distance from 1 is within it, MISSED when
the ratio less that distance is over it, else UNRESOLVED (the floor is wider than the distance to
the target: more rounds narrow it). Single runs of one variant swing by 10-25 % on a shared 2-core
box, so the floor is rarely within 2 %: ``bench/first_records.py`` measures what the first records
cost within one process and on one trace, where the floor is narrower.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TARGET = 1.02


def verdict(ratio: float, floor: float) -> str:
    """MET when ``ratio`` plus the A/A ``floor``'s distance from 1 is within the target, MISSED when
    ``ratio`` less that distance is over it, else UNRESOLVED."""
    distance = abs(floor - 1.0)
    if ratio + distance <= TARGET:
        return "MET"
    if ratio - distance > TARGET:
        return "MISSED"
    return "UNRESOLVED (the A/A floor is wider than the distance to the target)"


def one_run(replicas: int, steps: int, agent: bool) -> float:
    """The run's median step time within epochs, in seconds."""
    cmd = [sys.executable, str(HERE / "_tutorial_loop.py"), "--replicas", str(replicas), "--steps", str(steps)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("TPUWATCH_LOSS_EVERY_S", None)  # the default pacing, as users run it
    with tempfile.TemporaryDirectory(prefix="tpuwatch-short-run-") as tmp:
        if agent:
            cmd[1:1] = ["-m", "tpuwatch.agent", "--run-dir", str(Path(tmp) / "run")]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=tmp)
    for line in out.stdout.splitlines():
        if line.startswith("steps="):
            fields = dict(part.split("=") for part in line.split())
            return float(fields["median_ms"]) / 1e3
    raise SystemExit(f"short_run: the loop printed no result (exit {out.returncode}): {out.stderr[-2000:]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4, help="runs of each variant per replica count")
    p.add_argument("--replicas", default="1,2,4")
    p.add_argument("--steps", type=int, default=300)
    a = p.parse_args()
    if a.rounds < 2:
        p.error("--rounds must be 2 or more: the A/A floor compares the plain runs' two halves")
    rng = random.Random(0)
    for replicas in (int(r) for r in a.replicas.split(",")):
        runs: dict[bool, list[float]] = {False: [], True: []}
        load0 = os.getloadavg()[0]
        for _ in range(a.rounds):
            order = [False, True]
            rng.shuffle(order)
            for agent in order:
                runs[agent].append(one_run(replicas, a.steps, agent))
        plain, agent = statistics.median(runs[False]), statistics.median(runs[True])
        halves = runs[False][0::2], runs[False][1::2]
        floor = statistics.median(halves[1]) / statistics.median(halves[0]) if all(halves) else 1.0
        ratio = agent / plain
        print(f"{replicas} replica(s): plain {plain * 1e3:.3f} ms, agent {agent * 1e3:.3f} ms, agent/plain "
              f"{ratio:.4f} (A/A floor {floor:.4f}; runs plain {[round(x * 1e3, 3) for x in runs[False]]}, agent "
              f"{[round(x * 1e3, 3) for x in runs[True]]}; load {load0:.2f}->{os.getloadavg()[0]:.2f}): "
              f"{verdict(ratio, floor)} (target <= {TARGET})", flush=True)


if __name__ == "__main__":
    main()

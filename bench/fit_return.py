"""How long ``model.fit`` takes to return after Keras' last epoch line, run
plainly and under the agent: the time from the last epoch's progress line to the script's next
print, read from the script's unbuffered stdout as it arrives.

    python bench/fit_return.py [--repeat 5] [--root DIR] [-- extra keras_fit.py args]

Runs ``sample_runs/keras_fit.py --epochs 3 --steps-per-epoch 60`` (a short fit), plain and
under ``python -m tpuwatch.agent``, alternating, and prints each delay, the medians, the difference
(target: agent <= plain + 0.2 s) and the load average. ``--root`` picks the tpuwatch source tree
the agent runs from (an older checkout, to compare).

What the pause is (measured on this project's 2-core box): the main thread sits in C
code right after Keras' ``fit`` (or ``evaluate``) body returned, inside Keras' traceback wrapper,
while the frame's distributed iterator is destroyed; a ``sys.setprofile`` trace saw no Python call
in it. Plain runs pause the same way: 0.0-15 s plain and 0.0-24 s under the agent in the same
series at load 4-10, with no ordering between the two, and medians within 0.01 s at load 2-3.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "sample_runs" / "keras_fit.py"
EPOCH_LINE = re.compile(rb"^\d+/\d+ - .*loss")


def delay(cmd: list[str], env: dict, cwd: str, epochs: int, timeout: float = 600) -> float:
    """Seconds from the last epoch's progress line to the next line the script prints."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=cwd)
    assert proc.stdout is not None
    seen = 0
    last_epoch_t: float | None = None
    result = float("nan")
    for line in proc.stdout:
        now = time.monotonic()
        if EPOCH_LINE.match(line):
            seen += 1
            if seen == epochs:
                last_epoch_t = now
        elif last_epoch_t is not None and result != result:
            result = now - last_epoch_t
    proc.wait(timeout=timeout)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=60)
    p.add_argument("--root", type=Path, default=ROOT, help="tpuwatch source tree for the agent")
    a = p.parse_args()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(a.root), "PYTHONUNBUFFERED": "1"}
    args = ["--epochs", str(a.epochs), "--steps-per-epoch", str(a.steps_per_epoch)]
    runs: dict[str, list[float]] = {"plain": [], "agent": []}
    for i in range(a.repeat):
        for mode in ("plain", "agent"):
            with tempfile.TemporaryDirectory() as tmp:
                cmd = [sys.executable, str(SCRIPT), *args]
                if mode == "agent":
                    cmd[1:1] = ["-m", "tpuwatch.agent", "--run-dir", str(Path(tmp) / "run")]
                d = delay(cmd, env, tmp, a.epochs)
            runs[mode].append(d)
            print(f"run {i + 1} {mode:>5}: last epoch line -> next print {d:6.2f} s "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
    plain, agent = statistics.median(runs["plain"]), statistics.median(runs["agent"])
    print(f"median plain {plain:.2f} s, agent {agent:.2f} s: agent - plain {agent - plain:+.2f} s "
          f"(target <= +0.20 s); max plain {max(runs['plain']):.2f} s, agent {max(runs['agent']):.2f} s; "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

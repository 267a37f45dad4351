"""How long a job outlives its script: the time from the script's last line of output to the
process's exit, for a Keras fit and a custom loop with live distributed iterators, run plainly and
under the agent (TensorFlow's teardown of live distributed iterators can take seconds
to minutes; the agent bounds it at TPUWATCH_TEARDOWN_S).

    python bench/exit_delay.py [--repeat 3] [--root DIR]

``--root`` picks the tpuwatch source tree the agent runs from (an older checkout, to compare).
Prints each delay and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "corpus" / "scripts"
SCRIPTS = {
    "fit (validation, callbacks)": ["fit_callbacks.py", "--epochs", "2", "--steps", "5"],
    "custom loop (tutorial)": ["custom_loop_tutorial.py", "--epochs", "2", "--batches", "4"],
}


def delay(cmd: list[str], env: dict, cwd: str, timeout: float = 600) -> float:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=cwd)
    last = time.monotonic()
    for _ in proc.stdout:
        last = time.monotonic()
    proc.wait(timeout=timeout)
    return time.monotonic() - last


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--root", type=Path, default=ROOT, help="tpuwatch source tree for the agent")
    a = p.parse_args()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(a.root)}
    for name, (script, *args) in SCRIPTS.items():
        for mode in ("plain", "agent"):
            runs = []
            for _ in range(a.repeat):
                with tempfile.TemporaryDirectory() as tmp:
                    cmd = [sys.executable, str(CORPUS / script), *args]
                    if mode == "agent":
                        cmd[1:1] = ["-m", "tpuwatch.agent", "--run-dir", str(Path(tmp) / "run")]
                    runs.append(delay(cmd, env, tmp))
            print(f"{name:>28} {mode:>5}: last line -> exit {statistics.median(runs):6.2f} s median "
                  f"(runs {', '.join(f'{r:.2f}' for r in runs)}; load {os.getloadavg()[0]:.2f})", flush=True)


if __name__ == "__main__":
    main()

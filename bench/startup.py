"""How fast tpuwatch starts: ``tpuwatch --help``, and the dashboard's first frame in a terminal.

- ``--help``: wall time of ``tpuwatch --help`` (the installed console script, else
  ``python -m tpuwatch``) in a fresh process each time, from spawn to exit; median of ``--runs``
  (default 10) after one discarded run (which warms the OS file cache). Target < 0.3 s.
- first frame: ``tpuwatch replay RUN_DIR`` of tests/data/healthy_4replica.jsonl in a 120x40 pty
  (bench/ptyterm.py); time from spawn until the pty has printed the run's header text (the
  script name, ``train.py``), i.e. the dashboard is on screen with the run in it; median of
  ``--frames`` (default 5). Target < 1 s.

Prints every run's time, the medians and the load average. Asserts nothing.

    .venv/bin/python bench/startup.py [--runs 10] [--frames 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from ptyterm import PtyProgram  # noqa: E402

RECORDING = ROOT / "tests" / "data" / "healthy_4replica.jsonl"
HEADER_TEXT = b"train.py"


def tpuwatch_argv() -> list[str]:
    script = Path(sys.executable).with_name("tpuwatch")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tpuwatch"]


def help_times(runs: int, env: dict[str, str]) -> list[float]:
    times = []
    for i in range(runs + 1):
        t0 = time.perf_counter()
        subprocess.run([*tpuwatch_argv(), "--help"], stdout=subprocess.DEVNULL, check=True, env=env, cwd=ROOT)
        if i:  # the first run only warms the file cache
            times.append(time.perf_counter() - t0)
    return times


def first_frame_times(frames: int, env: dict[str, str]) -> list[float]:
    run_dir = Path(tempfile.mkdtemp(prefix="tpuwatch-startup-")) / "run"
    run_dir.mkdir()
    shutil.copy(RECORDING, run_dir / "events.jsonl")
    (run_dir / "output.log").write_text("Epoch 1/3\n")
    times = []
    try:
        for _ in range(frames):
            prog = PtyProgram([*tpuwatch_argv(), "replay", str(run_dir)], env=env, cwd=str(ROOT),
                              wait_for=HEADER_TEXT).start()
            try:
                deadline = time.perf_counter() + 20
                while prog.found_at is None and time.perf_counter() < deadline and prog.proc.poll() is None:
                    time.sleep(0.005)
                if prog.found_at is None:
                    raise SystemExit(f"no {HEADER_TEXT!r} on screen within 20 s (exit {prog.proc.poll()})")
                times.append(prog.found_at)
            finally:
                prog.stop(keys=b"q")
    finally:
        shutil.rmtree(run_dir.parent, ignore_errors=True)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10, help="--help runs (median)")
    ap.add_argument("--frames", type=int, default=5, help="first-frame runs (median)")
    a = ap.parse_args()
    home = tempfile.mkdtemp(prefix="tpuwatch-home-")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPUWATCH_HOME=home)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} cores")
    print(f"command: {' '.join(tpuwatch_argv())}")
    h = help_times(a.runs, env)
    print(f"tpuwatch --help: median {statistics.median(h):.3f} s (min {min(h):.3f}, max {max(h):.3f}; "
          f"{len(h)} runs: {', '.join(f'{x:.3f}' for x in h)})  target < 0.3 s")
    f = first_frame_times(a.frames, env)
    print(f"first frame (replay, 120x40 pty, until {HEADER_TEXT.decode()!r} is on screen): median "
          f"{statistics.median(f):.3f} s (min {min(f):.3f}, max {max(f):.3f}; {len(f)} runs: "
          f"{', '.join(f'{x:.3f}' for x in f)})  target < 1 s")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()

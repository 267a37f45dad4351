"""Bytes per second the dashboard writes to a real terminal at steady state, next to htop and top.

Each program runs in a 120x40 pty (``TERM=xterm-256color``, the pty its controlling terminal;
bench/ptyterm.py) whose master side a thread drains continuously. The first ``--warmup``
seconds (startup, first full paint) are discarded; bytes are then counted over ``--measure``
seconds, and the program's CPU time (psutil, user + system, its process only) over the same
window gives its CPU % of one core.

The dashboard is ``python -m tpuwatch attach RUN_DIR`` on a live synthetic run: a writer process
(bench/live_writer.py) appends realistic protocol lines (4 replica losses per step, host + 4
device samples at 4 Hz) at 50 and at 500 steps/s. htop runs with its default delay (1.5 s),
``top -d 1`` refreshes every second. Prints bytes/s for each and the ratios tpuwatch / htop.
Asserts nothing.

    .venv/bin/python bench/terminal_bytes.py [--warmup 3] [--measure 15] [--rates 50,500]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from ptyterm import PtyProgram  # noqa: E402


@dataclass(frozen=True)
class Measured:
    label: str
    bytes_per_s: float
    cpu_pct: float
    startup_bytes: int


def measure(label: str, argv: list[str], warmup: float, seconds: float, env: dict[str, str]) -> Measured:
    prog = PtyProgram(argv, env=env, cwd=str(ROOT)).start()
    try:
        ps = psutil.Process(prog.proc.pid)
        time.sleep(warmup)
        if prog.proc.poll() is not None:
            raise SystemExit(f"{label}: exited during warm-up with {prog.proc.returncode}")
        c0 = ps.cpu_times()
        t0 = time.perf_counter()
        time.sleep(seconds)
        c1 = ps.cpu_times()
        t1 = time.perf_counter()
        if prog.proc.poll() is not None:
            raise SystemExit(f"{label}: exited during the measurement with {prog.proc.returncode}")
        n = prog.bytes_between(t0, t1)
        first = prog.bytes_between(0.0, t0)
    finally:
        prog.stop()
    cpu = (c1.user + c1.system) - (c0.user + c0.system)
    return Measured(label, n / (t1 - t0), 100 * cpu / (t1 - t0), first)


def tpuwatch_run(rate: float, warmup: float, seconds: float, env: dict[str, str]) -> Measured:
    run_dir = Path(tempfile.mkdtemp(prefix="tpuwatch-termbytes-")) / "run"
    writer = subprocess.Popen([sys.executable, str(ROOT / "bench" / "live_writer.py"), str(run_dir),
                               "--rate", str(rate), "--seconds", str(warmup + seconds + 10), "--sample-hz", "4"],
                              stdout=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 10
        while not (run_dir / "events.jsonl").exists():
            if time.monotonic() > deadline or writer.poll() is not None:
                raise SystemExit("the synthetic run did not start")
            time.sleep(0.05)
        time.sleep(0.5)  # some steps already there when the viewer attaches, as in real use
        return measure(f"tpuwatch attach, {rate:g} steps/s", [sys.executable, "-m", "tpuwatch", "attach", str(run_dir)],
                       warmup, seconds, env)
    finally:
        writer.terminate()
        writer.wait()
        shutil.rmtree(run_dir.parent, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds discarded after spawn")
    ap.add_argument("--measure", type=float, default=15.0, help="seconds counted")
    ap.add_argument("--rates", default="50,500", help="steps/s of the synthetic runs")
    a = ap.parse_args()
    home = tempfile.mkdtemp(prefix="tpuwatch-home-")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPUWATCH_HOME=home, HOME=home)

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} cores")
    results: list[Measured] = []
    for rate in (float(r) for r in a.rates.split(",")):
        results.append(tpuwatch_run(rate, a.warmup, a.measure, env))
    for label, argv in (("htop (default delay 1.5 s)", ["htop"]), ("top -d 1", ["top", "-d", "1"])):
        if shutil.which(argv[0]) is None:
            print(f"{argv[0]} is not installed; skipped (apt-get install -y {argv[0]})")
            continue
        results.append(measure(label, argv, a.warmup, a.measure, env))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"120x40 pty, first {a.warmup:g} s discarded, then {a.measure:g} s counted")
    for m in results:
        print(f"{m.label:>34}: {m.bytes_per_s:9.0f} B/s   CPU {m.cpu_pct:5.1f}% of a core   "
              f"(startup {m.startup_bytes} B)")
    htop = next((m for m in results if m.label.startswith("htop")), None)
    top = next((m for m in results if m.label.startswith("top")), None)
    for m in results:
        if m.label.startswith("tpuwatch"):
            ratios = []
            if htop:
                ratios.append(f"{m.bytes_per_s / htop.bytes_per_s:.2f}x htop")
            if top:
                ratios.append(f"{m.bytes_per_s / top.bytes_per_s:.2f}x top -d 1")
            print(f"{m.label:>34}: {', '.join(ratios)}")
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()

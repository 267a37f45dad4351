"""What the leak doctor's window costs the steps it samples: the planted leak scripts run under
``tpuwatch run --headless --no-auto-profile``, each window's step time inside it over the step
time just before it (both from the window's own ``AllocationSites``), with the line it named.

Every window is light first (no tracemalloc: a pass over the objects at its start and at its end);
one with tracemalloc follows only when the light one named no single line for half of what grew
(see tpuwatch/agent/leak_doctor.py), and then only its sites are sent: a line marked
"tracemalloc" is such a follow-up (the light window before it is not printed).

    python bench/leak_window.py [--rounds 2] [--scripts leak_dict_cache.py,...]

Prints one line per window and, at the end, the light windows' median ratio and how many were
within the target (1.2x while open), with the 1-minute load average before and after each run.
The step time before a window is a few seconds' mean, epoch boundaries included: one window's
ratio moves by +-0.15 from run to run; the median over the scripts and rounds is the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PLANTED = ROOT / "sample_runs" / "planted"
TARGET = 1.2
SCRIPTS = ("host_memory_growth_short.py", "leak_weight_history.py", "leak_dict_cache.py", "leak_tensor_list.py",
           "leak_mirrored_weights.py", "leak_replica_logits.py", "leak_numpy_function_memo.py")


def windows(script: str) -> list[dict]:
    """The run's AllocationSites messages."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        env = dict(os.environ, TPUWATCH_HOME=str(Path(tmp) / "home"), TF_CPP_MIN_LOG_LEVEL="2",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(run_dir),
                        "--no-auto-profile", str(PLANTED / script)], cwd=tmp, env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        msgs = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return [m for m in msgs if m["kind"] == "allocation_sites"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--scripts", default=",".join(SCRIPTS))
    args = p.parse_args()
    light: list[float] = []
    for _ in range(args.rounds):
        for script in args.scripts.split(","):
            load0 = os.getloadavg()[0]
            found = windows(script)
            load1 = os.getloadavg()[0]
            if not found:
                print(f"{script:30s} no window (load {load0:.2f}->{load1:.2f})", flush=True)
            for w in found:
                inside, before = w.get("step_time_inside_s"), w.get("step_time_before_s")
                ratio = inside / before if inside and before else None
                # a light window sends no tracemalloc growth; tracemalloc's always saw some
                kind = "tracemalloc" if w.get("traced_bytes") else "light"
                if ratio is not None and kind == "light":
                    light.append(ratio)
                shown = f"{ratio:.2f}x" if ratio is not None else "-"
                print(f"{script:30s} {kind:11s} window {w['window_s']:.2f} s  steps {w['step_from']}..{w['step_to']}  "
                      f"inside/before {shown}  site {w['sites'][0] if w['sites'] else '-'}  "
                      f"(load {load0:.2f}->{load1:.2f})", flush=True)
    if light:
        within = sum(r <= TARGET for r in light)
        print(f"light windows: median {statistics.median(light):.2f}x, {min(light):.2f}-{max(light):.2f}x, "
              f"{within} of {len(light)} within {TARGET}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

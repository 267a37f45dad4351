"""What the auto-profile costs the training: the step time just before the
capture, during it (its stop and export included: they run on the profiler's helper thread while
training goes on) and just after, as the agent measured them in its ``input_stages`` message, and
the ratios inside/before and after/before. Also the agent thread's cost of tapping each Step.

Runs a planted input-bound script (default ``input_sequential_map.py``) under ``tpuwatch run
--headless`` ``--rounds`` times. Run: ``python bench/auto_profile_cost.py [--script PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tap_cost_us(n: int = 200_000) -> float:
    """Agent-thread time to fold one Step into the auto-profile's sums."""
    sys.path.insert(0, str(ROOT))
    from tpuwatch.agent.auto_profile import AutoProfile
    from tpuwatch.protocol import step_values

    class Agent:
        step_probe = None

    auto = AutoProfile(Agent(), None)  # type: ignore[arg-type]
    fields = step_values(step=100, t=0.0, step_time_s=0.05, input_wait_s=0.01, loss=None)
    start = time.perf_counter()
    for _ in range(n):
        auto.tap(fields)
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--script", default=str(ROOT / "sample_runs" / "planted" / "input_sequential_map.py"))
    args = p.parse_args()
    print(f"load: {os.getloadavg()[0]:.1f} (1 min)")
    print(f"tap per Step on the agent thread: {tap_cost_us():.2f} us")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp) / "run"
            subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(run_dir),
                            args.script], env=env, capture_output=True, timeout=600, check=True)
            msgs = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        stages = [m for m in msgs if m["kind"] == "input_stages"]
        if not stages:
            print(f"round {r + 1}: no capture (the run never waited for input?)")
            continue
        m = stages[0]
        before, inside, after = m["step_time_before_s"], m["step_time_inside_s"], m["step_time_after_s"]

        def ms(v: float | None) -> str:
            return f"{v * 1000:.1f} ms" if v is not None else "-"

        def ratio(v: float | None, before: float | None = before) -> str:
            return f"{v / before:.2f}x" if v is not None and before else "-"

        print(f"round {r + 1}: steps {m['step_from']}-{m['step_to']}, capture {m['capture_s']:.2f} s; step time "
              f"before {ms(before)}, inside {ms(inside)} ({ratio(inside)}), after {ms(after)} ({ratio(after)}); "
              f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

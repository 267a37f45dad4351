"""What the run model costs a viewer, per message: ``RunState.apply`` and ``snapshot`` after a
million steps, reading a recording (``read_all``), and the diagnostics engine's ``apply`` and
``evaluate``. These were timed asserts in the tests once; a timing on a shared box is a benchmark's
job, so here they print, with the 1-minute load average, and the ratios that matter: a step
costs the viewer a small fraction of a step's own time at the dashboard's rates.

    .venv/bin/python bench/model_costs.py [--steps 1000000] [--lines 200000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "data"))

import make_recordings as mr  # noqa: E402

from tpuwatch import protocol  # noqa: E402
from tpuwatch.monitor.diagnostics import Engine  # noqa: E402
from tpuwatch.monitor.recording import read_all  # noqa: E402
from tpuwatch.monitor.state import RunState  # noqa: E402
from tpuwatch.protocol import Step  # noqa: E402

LOSSES = (0.5, 0.51, 0.49, 0.5)


def state_costs(n: int) -> tuple[float, float, float]:
    """(µs per apply, snapshot p50 ms, snapshot max ms) after ``n`` steps."""
    s = RunState(clock=lambda: mr.T0 + 20_000.0)
    for m in mr.healthy_messages(20)[:8]:
        if not isinstance(m, Step):
            s.apply(m)
    steps = [Step(i, mr.T0 + i * 0.01, 0.01, 0.0002, 0.5, LOSSES, 1, 64, "train_step") for i in range(1, n + 1)]
    t = time.perf_counter()
    for m in steps:
        s.apply(m)
    per_apply_us = (time.perf_counter() - t) / n * 1e6
    del steps
    times = []
    for i in range(30):
        s.apply(Step(n + 1 + i, mr.T0 + n * 0.01 + 1 + i * 0.01, 0.01, 0.0002, 0.5, LOSSES))
        t = time.perf_counter()
        s.snapshot()
        times.append(time.perf_counter() - t)
    times.sort()
    return per_apply_us, times[15] * 1e3, times[-1] * 1e3


def read_rate(lines: int) -> float:
    """Lines per second ``read_all`` decodes from a recording of ``lines`` step lines."""
    proto = protocol.encode(Step(1, mr.T0 + 0.05, 0.05, 0.001, 0.5, (0.51, 0.49, 0.5, 0.52), 1, 64, "train_step"))
    head, tail = proto.split(b'"step":1,', 1)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "events.jsonl"
        with open(path, "wb") as f:
            f.write(protocol.encode(mr.hello()))
            f.write(b"".join(head + b'"step":%d,' % i + tail for i in range(1, lines + 1)))
        t = time.perf_counter()
        messages, _ = read_all(path)
        return len(messages) / (time.perf_counter() - t)


def engine_costs(n: int) -> tuple[float, float]:
    """(µs per apply, ms per evaluate) of the diagnostics engine over ``n`` steady steps."""
    eng = Engine(clock=lambda: 0.0)
    t0 = 1_750_000_000.0
    msgs = [Step(step=i + 1, t=t0 + i * 0.01, step_time_s=0.01 * (1 + (i % 7) / 50), input_wait_s=0.0002, loss=1.0,
                 replica_losses=(1.0, 1.01, 0.99, 1.0), examples=64, function="train_step", epoch=i // 10000)
            for i in range(n)]
    t = time.perf_counter()
    for m in msgs:
        eng.apply(m, worker="h:1")
    per_apply_us = (time.perf_counter() - t) / n * 1e6
    t = time.perf_counter()
    eng.evaluate(now=0.0)
    return per_apply_us, (time.perf_counter() - t) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--lines", type=int, default=200_000)
    a = p.parse_args()
    load0 = os.getloadavg()[0]
    apply_us, snap_p50, snap_max = state_costs(a.steps)
    rate = read_rate(a.lines)
    eng_us, eval_ms = engine_costs(50_000)
    # A 10 ms step (100 steps/s) against what one step costs the viewer: state + engine.
    share = (apply_us + eng_us) / 10_000
    print(f"RunState: apply {apply_us:.2f} us/step after {a.steps:,} steps; snapshot p50 {snap_p50:.3f} ms, "
          f"max {snap_max:.3f} ms")
    print(f"read_all: {rate:,.0f} lines/s ({rate / 20_000:.1f}x the 20,000 lines/s the tests once asked)")
    print(f"Engine: apply {eng_us:.2f} us/step, evaluate {eval_ms:.1f} ms")
    print(f"a viewer spends {100 * share:.3f}% of a 10 ms step per step (state + diagnostics); "
          f"load average (1 min) {load0:.2f} -> {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

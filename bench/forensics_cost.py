"""What the forensics cost a run (stacks when training stops, a profile when it slows):

* the agent thread's time per Step for the stall watch's tap (``StallStacks.tap``) and the
  slow-steps trigger (``AutoProfile.tap``, which now also judges slow calls): nothing of either
  runs on the training thread;
* the pause of taking the stall stacks (``StallStacks.take``: ``sys._current_frames()``, every
  thread's frames, the text and its file), which holds the GIL on the agent's thread once per
  stall, in a process with TensorFlow imported and a tf.data pipeline running (its threads);
* from a recording of ``sample_runs/planted/slow_steps.py`` (``--run-dir``): the step time of the
  slow calls before the slowdown's capture, inside it and after it (the capture's pause).

Run: ``python bench/forensics_cost.py [--run-dir RUN]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def tap_costs_us(n: int = 100_000) -> tuple[float, float]:
    from tpuwatch.agent.auto_profile import AutoProfile
    from tpuwatch.agent.runtime import Agent
    from tpuwatch.agent.stacks import StackDumper, StallStacks
    from tpuwatch.protocol import step_values

    with tempfile.TemporaryDirectory() as d:
        agent = Agent(Path(d), "bench")
        watch = StallStacks(agent, StackDumper(agent))
        rows = [step_values(step=i, t=1000.0 + i * 0.01, step_time_s=0.01, input_wait_s=0.0001, loss=None,
                            function="train_step") for i in range(1, n + 1)]
        t0 = time.perf_counter()
        for r in rows:
            watch.tap([r])
        stall_us = (time.perf_counter() - t0) / n * 1e6

        class Profiler:
            active = None

        auto = AutoProfile(agent, Profiler())  # type: ignore[arg-type]
        t0 = time.perf_counter()
        for i, r in enumerate(rows):
            auto.tap(r)
            if i % 25 == 24:  # the sampler recomputes the median at 4 Hz (100 steps/s)
                auto._sample_slow()
        auto_us = (time.perf_counter() - t0) / n * 1e6
    return stall_us, auto_us


def take_pause_ms(rounds: int = 20) -> list[float]:
    import tensorflow as tf

    from tpuwatch.agent.runtime import Agent
    from tpuwatch.agent.stacks import StackDumper, StallStacks

    def gen():
        while True:
            time.sleep(0.001)
            yield 1.0

    ds = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec((), tf.float32)).batch(4).prefetch(2)
    it = iter(ds)
    next(it)  # tf.data's threads running the generator
    stop = threading.Event()
    workers = [threading.Thread(target=stop.wait, name=f"worker-{i}", daemon=True) for i in range(8)]
    for w in workers:
        w.start()
    out = []
    with tempfile.TemporaryDirectory() as d:
        agent = Agent(Path(d), "bench")
        watch = StallStacks(agent, StackDumper(agent))
        watch.last_step = 10
        for _ in range(rounds):
            t0 = time.perf_counter()
            watch.take(12.0, 10.0)
            out.append((time.perf_counter() - t0) * 1e3)
    stop.set()
    return out


def capture_pause(run_dir: Path) -> str:
    rows = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    (slow,) = [r for r in rows if r["kind"] == "slow_steps"]
    steps = {r["step"]: r["step_time_s"] for r in rows if r["kind"] == "step"}
    first, a, b = slow["first_slow_step"], slow["step_from"], slow["step_to"]
    before = [steps[s] for s in range(first + 1, a) if s in steps]
    inside = [steps[s] for s in range(a, b + 1) if s in steps]
    after = [steps[s] for s in range(b + 1, b + 1 + len(inside)) if s in steps and steps[s] > 2 * slow["normal_step_s"]]
    med = statistics.median
    return (f"slow calls before the capture {1e3 * med(before):.1f} ms ({len(before)}), inside {1e3 * med(inside):.1f} ms "
            f"({len(inside)}), after {1e3 * med(after):.1f} ms ({len(after)}): inside/before "
            f"{med(inside) / med(before):.2f}x, after/before {med(after) / med(before):.2f}x")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", type=Path, help="a recording of sample_runs/planted/slow_steps.py")
    args = p.parse_args()
    stall_us, auto_us = tap_costs_us()
    print(f"agent thread per Step: stall watch tap {stall_us:.2f} us, auto-profile tap (slow steps judged) "
          f"{auto_us:.2f} us; training thread: 0")
    pauses = sorted(take_pause_ms())
    print(f"stall stacks taken (TF imported, a tf.data generator running, 8 idle threads): median "
          f"{statistics.median(pauses):.1f} ms, max {pauses[-1]:.1f} ms, once per stall")
    if args.run_dir:
        print(capture_pause(args.run_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())

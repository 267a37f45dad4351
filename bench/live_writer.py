"""A synthetic live run: appends protocol lines to RUN_DIR/events.jsonl as an agent would.

Hello, Topology (MirroredStrategy, 4 replicas), Config, a Retrace, then step records with 4
replica losses at ``--rate`` steps/s (tests/data/make_recordings.py's ``steps()``: jittered step
times, decaying noisy losses) and host + 4 device samples at ``--sample-hz``, all stamped with
the wall clock. Lines are written in batches every 20 ms, whole lines per write(2), like the
agent's recorder. Ends with an Exit record after ``--seconds``.

    .venv/bin/python bench/live_writer.py RUN_DIR [--rate 50] [--seconds 30] [--sample-hz 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "data"))

import make_recordings as mr  # noqa: E402

from tpuwatch import protocol, rundir  # noqa: E402

FLUSH_S = 0.02


def write_live(run_dir: Path, rate: float, seconds: float, sample_hz: float) -> int:
    """Writes the run in real time; returns the number of steps written."""
    rundir.create(run_dir)
    (run_dir / rundir.OUTPUT).write_text("Epoch 1/3\n")
    t0 = time.time()
    total = int(rate * seconds)
    head = [
        mr.hello(t0, run_id=run_dir.name, pid=os.getpid(), host="bench", worker=f"bench:{os.getpid()}"),
        mr.topology(t0),
        protocol.Config(t=t0, mixed_precision="float32", global_batch_size=64, per_replica_batch_size=16,
                        steps_per_execution=1, total_steps=total, epochs=1),
        protocol.Retrace(t=t0, function="train_step", traces=1, instances=1,
                         signature="(x: float32[16, 28, 28, 1], y: int64[16])", change="", step=0),
    ]
    steps = mr.steps(total, t0=t0, step_time_s=1.0 / rate, input_wait_frac=0.02, seed=7)
    pending = next(steps, None)
    next_sample = t0
    written = 0
    with open(run_dir / rundir.EVENTS, "ab", buffering=0) as f:
        f.write(b"".join(protocol.encode(m) for m in head))
        while pending is not None:
            now = time.time()
            buf: list[bytes] = []
            while pending is not None and pending.t <= now:
                buf.append(protocol.encode(pending))
                written += 1
                pending = next(steps, None)
            while next_sample <= now:
                buf.extend(protocol.encode(m) for m in mr.samples(next_sample, next_sample))
                next_sample += 1.0 / sample_hz
            if buf:
                f.write(b"".join(buf))
            time.sleep(FLUSH_S)
        f.write(protocol.encode(protocol.Exit(t=time.time(), exit_code=0)))
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--rate", type=float, default=50.0, help="steps per second")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--sample-hz", type=float, default=4.0, help="host/device samples per second")
    a = ap.parse_args()
    print(write_live(a.run_dir, a.rate, a.seconds, a.sample_hz), flush=True)


if __name__ == "__main__":
    main()

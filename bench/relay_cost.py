"""What ``--notify``, ``--metrics`` and ``--tensorboard`` cost the viewer's process.

They share one relay thread (tpuwatch/console/relay.py) that reads the run's recording with its own
run state and findings engine, beside whatever view is open. This times that thread draining a
recorded run (tests/data/make_recordings.py's healthy run: 4 replicas, a host and four device
samples every 0.5 s), with no outlet, and with each outlet and all three, and prints microseconds
per message, messages per second, and the share of a core one host's stream would take (a host
sends ~30 messages/s, docs/performance.md "One viewer over a pod"). Prints the 1-minute load.

    python bench/relay_cost.py [--steps 20000]
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
sys.path.append(str(ROOT / ".tensorboard-site"))  # where .ci/run keeps tensorboard

import make_recordings as mr  # noqa: E402

from tpuwatch.console.alerts import Alerts  # noqa: E402
from tpuwatch.console.metrics_server import RunMetrics  # noqa: E402
from tpuwatch.console.relay import Relay, relay_source  # noqa: E402

HOST_MESSAGES_PER_S = 30


def drain(run_dir: Path, outlets: list) -> float:
    relay = Relay(relay_source(run_dir), lambda: False, outlets, exit_grace_s=0.0)
    t0 = time.process_time()
    relay.start()
    relay.close(timeout_s=600)
    assert relay.error is None and not relay.errors, (relay.error, relay.errors)
    return time.process_time() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20000)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    run_dir = tmp / "run"
    run_dir.mkdir()
    messages = mr.healthy_messages(a.steps)
    mr.write(run_dir / "events.jsonl", messages)
    n = len(messages)

    def tensorboard():
        from tpuwatch.console.tensorboard_export import TensorBoardExport

        return TensorBoardExport(tmp / f"tb-{time.monotonic_ns()}", "bench")

    configs = {
        "no outlet (state + findings engine)": lambda: [],
        "--notify true": lambda: [Alerts(["true"], report=print)],
        "--metrics": lambda: [RunMetrics()],
        "--tensorboard": lambda: [tensorboard()],
        "all three": lambda: [Alerts(["true"], report=print), RunMetrics(), tensorboard()],
    }
    print(f"{n:,} messages ({a.steps:,} steps); load {os.getloadavg()[0]:.2f}")
    base = None
    for name, make in configs.items():
        cpu = min(drain(run_dir, make()) for _ in range(2))  # process CPU time, best of two
        us = 1e6 * cpu / n
        base = base or us
        print(f"  {name:<38} {us:6.1f} us/message  {n / cpu:9,.0f} messages/s  "
              f"{100 * us * HOST_MESSAGES_PER_S / 1e6:5.2f}% of a core per host  x{us / base:.2f}")
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

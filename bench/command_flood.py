"""Does a viewer that floods the agent with commands slow training down?

Runs the robustness training loop (MirroredStrategy over 4 logical CPU devices) under the agent,
alternately alone and with one local viewer sending commands as fast as its socket takes them
(``no-such-action``: each one that reaches the agent costs a result line in the recording). Each
run's speed is its steps per second between the 50th and the last step (from the recording).
Prints the median speed of each kind, the ratio flood/alone, the recording's size and result
count under the flood, and the 1-minute load average. Asserts nothing.

    .venv/bin/python bench/command_flood.py [--steps 1500] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tpuwatch import protocol  # noqa: E402
from tpuwatch.protocol import Attach, Command, Result, Step  # noqa: E402

SCRIPT = ROOT / "tests" / "robustness" / "scripts" / "robust_train.py"


def _run(tmp: Path, name: str, steps: int, flood: bool) -> tuple[float, int, int]:
    run_dir = tmp / name
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen([sys.executable, "-m", "tpuwatch.agent", "--run-dir", str(run_dir), str(SCRIPT),
                             "--steps", str(steps)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stop = threading.Event()

    def flooder() -> None:
        sock_path = run_dir / "agent.sock"
        while not sock_path.exists() and proc.poll() is None:
            time.sleep(0.05)
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(sock_path))
            s.sendall(protocol.encode(Attach(protocol_version=protocol.PROTOCOL_VERSION, offset=-1)))
            batch = b"".join(protocol.encode(Command(id=f"f{i}", action="no-such-action", args={}))
                             for i in range(200))
            while not stop.is_set():
                s.sendall(batch)
        except OSError:
            return

    t = threading.Thread(target=flooder, daemon=True)
    if flood:
        t.start()
    proc.wait(timeout=1800)
    stop.set()
    dec = protocol.Decoder()
    stamps, results = [], 0
    with open(run_dir / "events.jsonl", "rb") as f:
        for line in f:
            m = dec.decode(line)
            if isinstance(m, Step):
                stamps.append(m.t)
            elif isinstance(m, Result):
                results += 1
    speed = (len(stamps) - 50) / (stamps[-1] - stamps[49]) if len(stamps) > 60 else float("nan")
    return speed, (run_dir / "events.jsonl").stat().st_size, results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    alone, flooded, sizes, counts = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            alone.append(_run(Path(tmp), f"alone{r}", a.steps, False)[0])
            speed, size, results = _run(Path(tmp), f"flood{r}", a.steps, True)
            flooded.append(speed)
            sizes.append(size)
            counts.append(results)
    a_med, f_med = statistics.median(alone), statistics.median(flooded)
    print(f"alone {a_med:.0f} steps/s, flooded {f_med:.0f} steps/s, ratio {f_med / a_med:.3f}; under the flood "
          f"the recording was {max(sizes) / 1e6:.2f} MB with {max(counts)} results; "
          f"load average (1 min) {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

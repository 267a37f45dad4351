"""What the full-disk guard on the script's stdout costs per print (tpuwatch/agent/guards.py).

The agent replaces ``sys.stdout``/``sys.stderr`` (when they are regular files, as under
``tpuwatch run``) with writers that drop what a full disk refuses instead of raising. This
times ``print`` of a Keras-progress-sized line to a regular file, unbuffered as under ``tpuwatch
run`` (PYTHONUNBUFFERED), with the plain stream and with the guarded one, in interleaved blocks.
Prints µs per print for each, the ratio, and the 1-minute load average. Asserts nothing.

    .venv/bin/python bench/output_guard.py [--prints 20000] [--blocks 10]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tpuwatch.agent.guards import OutputGuard, _wrap  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prints", type=int, default=20000)
    ap.add_argument("--blocks", type=int, default=10)
    a = ap.parse_args()
    line = "1234/5000 [=====>........] - ETA: 12s - loss: 0.1234 - accuracy: 0.9876"
    with tempfile.TemporaryDirectory() as tmp:
        fd = os.open(Path(tmp) / "out.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        plain = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), write_through=True)
        guarded = _wrap(plain, OutputGuard())
        times: dict[str, list[float]] = {"plain": [], "guarded": []}
        for _ in range(a.blocks):
            for name, stream in (("plain", plain), ("guarded", guarded)):
                t0 = time.perf_counter()
                for _ in range(a.prints):
                    print(line, file=stream)
                times[name].append((time.perf_counter() - t0) / a.prints * 1e6)
        os.close(fd)
    p, g = statistics.median(times["plain"]), statistics.median(times["guarded"])
    print(f"print to a file: plain {p:.2f} µs, guarded {g:.2f} µs, ratio {g / p:.3f} "
          f"(extra {g - p:+.2f} µs a print); load average (1 min) {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

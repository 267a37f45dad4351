"""Does a viewer that connects and stops reading slow training down? One run, interleaved phases.

A real agent runs a small MirroredStrategy loop (4 logical CPU devices). This process watches its
step counter and alternates blocks of steps *with* stuck viewers (each connects to the agent's
socket, asks for the recording from byte 0 and never reads; a new set per block, so the agent has
to fill their socket buffers again each time) and *without* (closed). Interleaving cancels slow
drift of the machine. The agent's send timeout is left at its default (30 s), so the viewers stay
stuck for the whole block rather than being dropped.

Prints the median step time in each kind of block, the ratio with/without (target <= 1.01), and
the agent's RSS at the first and last block. Asserts nothing.

    .venv/bin/python bench/slow_viewer.py [--steps 3000] [--block 150] [--viewers 4] [--width 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tpuwatch import protocol  # noqa: E402

SCRIPT = ROOT / "tests" / "robustness" / "scripts" / "robust_train.py"
SETTLE = 5  # steps after each switch that belong to neither kind of block


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--block", type=int, default=150, help="steps per block")
    ap.add_argument("--viewers", type=int, default=4, help="stuck viewers in a 'with' block")
    ap.add_argument("--width", type=int, default=0,
                    help="two hidden layers of this many units (1024: a ~20-40 ms step on a 2-core CPU); "
                         "default: the script's tiny model (~2-5 ms steps)")
    args = ap.parse_args()

    import psutil

    load0 = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="slow-viewer-bench-"))
    run_dir = tmp / "run"
    ready = tmp / "ready"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen([sys.executable, "-m", "tpuwatch.agent", "--run-dir", str(run_dir), str(SCRIPT),
                             "--steps", str(args.steps), "--ready", str(ready),
                             *(("--width", str(args.width), "--depth", "2") if args.width else ())],
                            stdout=open(tmp / "out.log", "wb"), stderr=subprocess.STDOUT, env=env)
    switches: list[tuple[int, bool]] = []  # (step at the switch, viewers on after it)
    stuck: list[socket.socket] = []
    rss: list[int] = []
    try:
        while proc.poll() is None and not ready.exists():
            time.sleep(0.05)
        sock_path = json.loads((run_dir / "run.json").read_text())["socket"]
        on = False
        next_switch = 50  # the first steps trace and compile
        while proc.poll() is None:
            try:
                step = int(ready.read_text() or 0)
            except (OSError, ValueError):
                step = 0
            if step >= next_switch:
                on = not on
                if on:
                    for _ in range(args.viewers):
                        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                        s.connect(sock_path)
                        s.sendall(protocol.encode(protocol.Attach(protocol_version=protocol.PROTOCOL_VERSION, offset=0)))
                        stuck.append(s)  # and never read
                else:
                    for s in stuck:
                        s.close()
                    stuck.clear()
                switches.append((step, on))
                next_switch = step + args.block
                try:
                    rss.append(psutil.Process(proc.pid).memory_info().rss)
                except psutil.NoSuchProcess:
                    pass
            time.sleep(0.002)
    finally:
        for s in stuck:
            s.close()
        proc.wait()

    steps = [m for m in map(protocol.Decoder().decode, (run_dir / "events.jsonl").read_bytes().splitlines())
             if isinstance(m, protocol.Step)]
    with_v, without_v = [], []
    for s in steps:
        state = None
        for at, on in switches:
            if s.step > at:
                state = on if s.step > at + SETTLE else None
        if state is True:
            with_v.append(s.step_time_s)
        elif state is False:
            without_v.append(s.step_time_s)
    if not with_v or not without_v:
        print("not enough steps in both kinds of block; raise --steps")
        return
    m_with, m_without = statistics.median(with_v), statistics.median(without_v)
    print(f"agent exit code {proc.returncode}; {len(steps)} steps; {len(switches)} blocks of {args.block}")
    print(f"median step time without viewers: {m_without * 1e3:.3f} ms ({len(without_v)} steps)")
    print(f"median step time with {args.viewers} stuck viewers: {m_with * 1e3:.3f} ms ({len(with_v)} steps)")
    print(f"ratio with/without: {m_with / m_without:.4f}  (target <= 1.01)  load {load0:.2f}->{os.getloadavg()[0]:.2f}")
    if rss:
        print(f"agent RSS: {rss[0] / 2**20:.0f} MiB at the first switch, {rss[-1] / 2**20:.0f} MiB at the last")
    print(f"recording: {(run_dir / 'events.jsonl').stat().st_size / 2**20:.1f} MiB in {run_dir}")


if __name__ == "__main__":
    main()

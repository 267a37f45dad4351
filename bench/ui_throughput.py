"""How the dashboard keeps up with a fast run: 5,000 steps/s for ~10 s.

A writer *subprocess* appends step records to events.jsonl the way the agent does (batches,
flushed every 20 ms, plus host/device samples at 2 Hz), so this process's CPU time is the
dashboard's alone: tailing + decoding + RunState + rendering, headless (Textual's run_test; a
real terminal adds the cost of writing frames, which is per refresh, not per step).

Prints numbers, asserts nothing:
- display lag: newest step shown vs newest step written, at each frame drawn (steps and seconds;
  the source is drained 4 times a second, numbers are drawn once a second), and the age of what
  the screen shows at any moment (lag + time since the last frame);
- refresh cost: wall time of one read (drain + apply + evaluate + snapshot), p50/p95/max, and on
  which thread it runs (the reader thread; in trees older than the reader thread, the UI thread);
- UI-thread time per second of wall time: the refreshes' share of the event loop (showing each
  frame; in those older trees, the whole refresh), and how late a 10 ms timer on the UI loop fires
  (p95/max: what a key press waits for at worst, GIL contention included);
- UI CPU: process_time delta / wall time over the run, % of one core (every thread);
- RSS before and after.

    .venv/bin/python bench/ui_throughput.py [--rate 5000] [--seconds 10] [--size 160x48]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WRITER = r"""
import sys, time, math
from pathlib import Path
from tpuwatch import protocol as p
run, rate, seconds = Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
devices = tuple(f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(4))
t0 = time.time()
with open(run / "events.jsonl", "ab", buffering=0) as f:
    f.write(p.encode(p.Hello(protocol_version=1, agent_version="bench", run_id="bench", t=t0, pid=1,
        host="bench", worker="bench:1", python_version="3", tf_version="2.21", keras_version="3",
        script="bench.py", argv=("bench.py",))))
    f.write(p.encode(p.Topology(t=t0, strategy="MirroredStrategy", replicas=4, local_replicas=4,
        num_workers=1, worker_index=0, device_kind="CPU", devices=devices, is_tpu=False)))
    f.write(p.encode(p.Config(t=t0, total_steps=int(rate * seconds), global_batch_size=64)))
    written, next_sample = 0, t0
    while True:
        now = time.time()
        if now - t0 >= seconds:
            break
        due = int((now - t0) * rate)
        buf = []
        for s in range(written + 1, due + 1):
            loss = 2.0 * math.exp(-s / 20000)
            buf.append(p.encode(p.Step(step=s, t=now, step_time_s=1 / rate, input_wait_s=0.02 / rate,
                loss=loss, replica_losses=(loss, loss * 1.01, loss * 0.99, loss), examples=64, epoch=0)))
        written = due
        if now >= next_sample:
            next_sample += 0.5
            buf.append(p.encode(p.HostSample(t=now, rss_bytes=2 << 30, available_bytes=12 << 30,
                total_bytes=16 << 30, cpu_percent=100.0)))
            for d in devices:
                buf.append(p.encode(p.DeviceSample(t=now, device=d, current_bytes=300 << 20, peak_bytes=400 << 20)))
        f.write(b"".join(buf))
        sys.stdout.write(f"{written}\n"); sys.stdout.flush()
        time.sleep(0.02)
    f.write(p.encode(p.Exit(t=time.time(), exit_code=0)))
print(written, flush=True)
"""


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / (1 << 20)


async def measure(rate: float, seconds: float, size: tuple[int, int]) -> None:
    t_import = time.perf_counter()
    from tpuwatch import rundir
    from tpuwatch.sources.file_source import make_file_source
    from tpuwatch.ui.app import TpuwatchApp

    run = Path(tempfile.mkdtemp(prefix="tpuwatch-bench-"))
    rundir.create(run)
    (run / rundir.OUTPUT).write_text("bench output\n")
    import_s = time.perf_counter() - t_import
    rss0 = rss_mib()
    t_app = time.perf_counter()
    app = TpuwatchApp(make_file_source(run, live=False), run_dir=run, refresh_hz=4)
    pulls: list[float] = []  # one read each: the reader thread's (the UI thread's in older trees)
    ui_s: list[float] = []  # the UI thread's part of each refresh
    lags_steps: list[float] = []
    lags_s: list[float] = []
    threaded = hasattr(app, "_reader")  # a reader thread reads, the UI shows frames
    if threaded:
        original_read = app._reader.read

        def timed_read():
            t = time.perf_counter()
            frame = original_read()
            pulls.append(time.perf_counter() - t)
            return frame

        app._reader.read = timed_read  # type: ignore[method-assign]
        original = app._show_frame
    else:
        original = app.pull

    shown: list = [None]
    frames = [0]
    on_screen_age: list[float] = []

    def timed_pull(*args) -> None:
        t = time.perf_counter()
        original(*args)
        ui_s.append(time.perf_counter() - t)
        if not threaded:
            pulls.append(ui_s[-1])
        s = app.snapshot
        if not (s.step and s.status == "running" and started is not None):
            return
        now = time.time()
        # Between frames the screen keeps the last one (numbers are shown once a second).
        on_screen_age.append(max(0.0, now - (s.last_step_t or now)))
        if s is shown[0]:
            return
        shown[0] = s
        frames[0] += 1
        produced = (now - started) * rate
        lags_steps.append(max(0.0, produced - s.step))
        lags_s.append(max(0.0, now - (s.last_step_t or now)))

    if threaded:
        app._show_frame = timed_pull  # type: ignore[method-assign]
    else:
        app.pull = timed_pull  # type: ignore[method-assign]
    started = None
    late: list[float] = []  # how late a 10 ms sleep on the UI loop wakes (its blocked time)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        first_frame_s = time.perf_counter() - t_app
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(run), str(rate), str(seconds)],
                                  stdout=subprocess.PIPE, env=env, text=True)
        started = time.time()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        # Let the UI run while the writer writes; the app's own 4 Hz refresh does the work.
        ui_before = len(ui_s)
        while writer.poll() is None:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            late.append(time.perf_counter() - t - 0.01)
        cpu1, wall1 = time.process_time(), time.perf_counter()
        ui_busy = sum(ui_s[ui_before:])
        last = int(writer.stdout.read().split()[-1])
        await pilot.pause(0.6)  # one more refresh to catch the tail
        final_step = app.snapshot.step  # not `shown`: the app may pull once more while it closes
    cpu_pct = 100 * (cpu1 - cpu0) / (wall1 - wall0)

    def pct(xs: list[float], q: float) -> float:
        if len(xs) < 2:
            return xs[0] if xs else float("nan")
        return statistics.quantiles(xs, n=100, method="inclusive")[q - 1]

    print(f"rate {rate:.0f} steps/s for {seconds:.0f} s, terminal {size[0]}x{size[1]}, headless")
    print(f"startup: imports {1e3 * import_s:.0f} ms, app to first frame {1e3 * first_frame_s:.0f} ms")
    print(f"steps written {last}, shown at the end {final_step} ({final_step / max(1, last):.3f} of written)")
    print(f"refreshes {len(pulls)} ({len(pulls) / (wall1 - wall0):.2f}/s)")
    print(f"refresh cost (drain+apply+evaluate+snapshot), on the {'reader' if threaded else 'UI'} thread: "
          f"p50 {1e3 * pct(pulls, 50):.1f} ms, p95 {1e3 * pct(pulls, 95):.1f} ms, max {1e3 * max(pulls):.1f} ms")
    print(f"UI thread in refreshes: {1e3 * ui_busy / (wall1 - wall0):.1f} ms per second "
          f"({'showing frames' if threaded else 'the whole refresh'}); a 10 ms timer on the UI loop "
          f"fires late by p50 {1e3 * pct(late, 50):.1f} ms, p95 {1e3 * pct(late, 95):.1f} ms, max {1e3 * max(late):.1f} ms")
    print(f"frames shown {frames[0]} ({frames[0] / (wall1 - wall0):.2f}/s)")
    if lags_steps:
        print(f"display lag (age of the newest step when a frame is drawn): p50 {pct(lags_steps, 50):.0f} steps / "
              f"{1e3 * pct(lags_s, 50):.0f} ms, p95 {pct(lags_steps, 95):.0f} steps / {1e3 * pct(lags_s, 95):.0f} ms, "
              f"max {max(lags_steps):.0f} steps / {1e3 * max(lags_s):.0f} ms")
        print(f"age of what is on screen at any drain (lag + time since the frame): p50 "
              f"{1e3 * pct(on_screen_age, 50):.0f} ms, max {1e3 * max(on_screen_age):.0f} ms")
    print(f"UI CPU: {cpu_pct:.1f}% of one core (process_time / wall); load average {os.getloadavg()[0]:.2f}")
    print(f"RSS: {rss0:.0f} MiB before the app, {rss_mib():.0f} MiB after")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=5000.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--size", default="160x48")
    ns = ap.parse_args()
    w, h = (int(x) for x in ns.size.split("x"))
    asyncio.run(measure(ns.rate, ns.seconds, (w, h)))


if __name__ == "__main__":
    main()

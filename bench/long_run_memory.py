"""Memory on a 1,000,000-step run stays bounded: the monitor state, the live dashboard, a replay.

1. Writes a 1,000,000-step recording to a temp file, streamed (never held in memory): 4 replica
   losses per step at ~20 ms/step (tests/data/make_recordings.py's ``steps()``), host + 4 device
   samples at 2 Hz, an epoch every 100,000 steps, ending with an exit record.
2. State (a fresh process): streams it (``iter_recording``) into ``RunState`` and the diagnostics
   ``FindingsFeed`` (evaluated once per recorded second, as every viewer does) and takes a
   snapshot every 10,000 steps. Prints RSS at 100k, 500k and 1M steps, snapshot time p50/max,
   and the apply rate.
3. Dashboard, live attach (a fresh process): ``TpuwatchApp`` headless (Textual ``run_test``,
   160x48) on a ``FileSource`` of the recording, the source ``tpuwatch attach`` uses: it catches up
   from byte 0 through its normal ``pull()`` (time-budgeted) until the reader is at the end.
   Prints RSS before the app and after catching up, the catch-up time and how long each pull
   took (the UI neither redraws nor takes keys during one).
4. Dashboard, replay (a fresh process): the same app on ``make_replay_source`` (what ``tpuwatch
   replay`` gives it), seeked to the end, pulled until every message is applied. Prints RSS.

Target: dashboard RSS < 200 MB and bounded (not growing with run length). Asserts nothing.

    .venv/bin/python bench/long_run_memory.py [--steps 1000000] [--keep PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "data"))

MiB = 1 << 20


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / MiB


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def generate(path: Path, n_steps: int) -> None:
    import make_recordings as mr

    from tpuwatch import protocol

    t0 = mr.T0
    step_s = 0.02
    epoch_len = 100_000
    head = [
        mr.hello(t0),
        mr.topology(t0 + 1.0),
        protocol.Config(t=t0 + 1.0, mixed_precision="float32", global_batch_size=64, per_replica_batch_size=16,
                        steps_per_execution=1, total_steps=n_steps, epochs=n_steps // epoch_len),
        protocol.Retrace(t=t0 + 1.2, function="train_step", traces=1, instances=1,
                         signature="(x: float32[16, 28, 28, 1], y: int64[16])", change="", step=0),
    ]
    next_sample = t0 + 1.5
    last_t = t0
    with open(path, "wb", buffering=1 << 20) as f:
        f.write(b"".join(protocol.encode(m) for m in head))
        buf: list[bytes] = []
        for s in mr.steps(n_steps, t0=t0 + 2.5, step_time_s=step_s, seed=11):
            while next_sample <= s.t:
                buf.extend(protocol.encode(m) for m in mr.samples(next_sample, next_sample))
                next_sample += 0.5
            if (s.step - 1) % epoch_len == 0:
                buf.append(protocol.encode(protocol.Epoch(t=s.t - s.step_time_s, epoch=(s.step - 1) // epoch_len,
                                                          phase="begin", step=s.step - 1)))
            buf.append(protocol.encode(dataclasses.replace(s, epoch=(s.step - 1) // epoch_len)))
            if s.step % epoch_len == 0:
                buf.append(protocol.encode(protocol.Epoch(t=s.t, epoch=(s.step - 1) // epoch_len, phase="end",
                                                          step=s.step, logs={"loss": round(s.loss, 4)})))
            last_t = s.t
            if len(buf) >= 10_000:
                f.write(b"".join(buf))
                buf.clear()
        buf.append(protocol.encode(protocol.Exit(t=last_t + 0.3, exit_code=0)))
        f.write(b"".join(buf))


def measure_state(path: Path) -> None:
    from tpuwatch.monitor.diagnostics.feed import FindingsFeed
    from tpuwatch.monitor.recording import iter_recording
    from tpuwatch.monitor.state import RunState
    from tpuwatch.protocol import Step

    print(f"  RSS after imports: {rss_mib():.0f} MiB")
    state = RunState()
    feed = FindingsFeed()
    messages, reader = iter_recording(path)
    snaps: list[float] = []
    marks = {100_000, 500_000, 1_000_000}
    t0 = time.perf_counter()
    n = 0
    last_t = 0.0
    for msg in messages:
        n += 1
        state.apply(msg)
        feed.apply(msg)
        t = getattr(msg, "t", None)
        if t is not None:
            last_t = t
            feed.evaluate(state, t)  # at most once per recorded second, like a viewer
        if isinstance(msg, Step) and msg.step % 10_000 == 0:
            s0 = time.perf_counter()
            state.snapshot(now=last_t)
            snaps.append(time.perf_counter() - s0)
            if msg.step in marks:
                print(f"  step {msg.step:>9,}: RSS {rss_mib():6.0f} MiB  ({time.perf_counter() - t0:.0f} s in)")
    wall = time.perf_counter() - t0
    snap = state.snapshot(now=last_t)
    print(f"  {n:,} messages applied in {wall:.1f} s ({n / wall:,.0f}/s, {1e6 * wall / n:.1f} µs each incl. decode)")
    print(f"  snapshot every 10k steps ({len(snaps)}): p50 {1e3 * statistics.median(snaps):.2f} ms, "
          f"max {1e3 * max(snaps):.2f} ms")
    print(f"  final: step {snap.step:,}, status {snap.status}, findings {len(snap.findings)}; "
          f"RSS {rss_mib():.0f} MiB, peak {peak_mib():.0f} MiB")


async def measure_app(path: Path, replay: bool) -> None:
    from tpuwatch import rundir
    from tpuwatch.sources.file_source import FileSource
    from tpuwatch.sources.replay_source import make_replay_source
    from tpuwatch.ui.app import TpuwatchApp

    run_dir = Path(tempfile.mkdtemp(prefix="tpuwatch-longrun-"))
    (run_dir / rundir.EVENTS).symlink_to(path)
    (run_dir / rundir.OUTPUT).write_text("Epoch 1/10\n")
    print(f"  RSS after imports: {rss_mib():.0f} MiB")
    t0 = time.perf_counter()
    if replay:
        source = make_replay_source(run_dir, speed=10.0)  # what `tpuwatch replay` uses
        print(f"  recording indexed by the replay source in {time.perf_counter() - t0:.1f} s: "
              f"RSS {rss_mib():.0f} MiB")
    else:
        source = FileSource(run_dir, live=False)
    app = TpuwatchApp(source, run_dir=run_dir, refresh_hz=0)
    pulls: list[float] = []  # wall time of each pull: the UI cannot redraw or take keys meanwhile
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        if replay:
            source.seek_end()
        while True:
            p0 = time.perf_counter()
            app.pull()
            pulls.append(time.perf_counter() - p0)
            await pilot.pause()  # let Textual render the new snapshot, as between timer ticks
            if replay and source._next >= len(source._messages):
                break
            if not replay and source._reader.caught_up:
                app.pull()
                break
        await pilot.pause(0.3)
        shown = app.snapshot.step
        wall = time.perf_counter() - t0
        print(f"  caught up to step {shown:,} in {wall:.1f} s; RSS {rss_mib():.0f} MiB, peak {peak_mib():.0f} MiB")
        print(f"  {len(pulls)} pulls while catching up: p50 {statistics.median(pulls):.2f} s, max {max(pulls):.2f} s "
              f"each (the app's own budget is 0.15 s; the UI is frozen during a pull)")


def child(kind: str, path: Path) -> None:
    if kind == "state":
        measure_state(path)
    else:
        asyncio.run(measure_app(path, replay=kind == "replay"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--keep", type=Path, help="write (or reuse) the recording here instead of a temp file")
    ap.add_argument("--only", choices=("state", "attach", "replay"), action="append",
                    help="run only these measurements (repeatable)")
    ap.add_argument("--child", choices=("state", "attach", "replay"), help=argparse.SUPPRESS)
    ap.add_argument("--path", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.path)
        return

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} cores")
    tmp = None
    if a.keep is not None and a.keep.exists():
        path = a.keep
        print(f"reusing {path} ({path.stat().st_size / MiB:.0f} MiB)")
    else:
        if a.keep is None:
            tmp = tempfile.TemporaryDirectory(prefix="tpuwatch-longrun-")
            path = Path(tmp.name) / "events.jsonl"
        else:
            path = a.keep
        t0 = time.perf_counter()
        generate(path, a.steps)
        print(f"generated {a.steps:,} steps: {path.stat().st_size / MiB:.0f} MiB in {time.perf_counter() - t0:.0f} s")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        for kind, title in (("state", "RunState + FindingsFeed, streamed"),
                            ("attach", "dashboard (TpuwatchApp, FileSource as in `tpuwatch attach`), catch-up"),
                            ("replay", "dashboard (TpuwatchApp, ReplaySource as in `tpuwatch replay`), seek to end")):
            if a.only and kind not in a.only:
                continue
            print(f"{title}:", flush=True)
            subprocess.run([sys.executable, __file__, "--child", kind, "--path", str(path)], env=env, check=False)
    finally:
        if tmp is not None:
            tmp.cleanup()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

"""``tpuwatch replay RUN``: play a recorded run back in the dashboard."""

from __future__ import annotations

import argparse
import sys

from tpuwatch import rundir
from tpuwatch.commands import dashboard
from tpuwatch.commands.lines import error


def add_parser(sub) -> argparse.ArgumentParser:
    replay = sub.add_parser("replay", help="play a recorded run back in the dashboard (needs a terminal; "
                                           "`tpuwatch report` prints a run's summary)")
    replay.add_argument("run", nargs="?", help="run id or run directory (default: the latest run)")
    replay.add_argument("--speed", type=float, default=1.0, help="playback speed (default 1x: as it ran)")
    return replay


def main(ns: argparse.Namespace) -> int:
    if ns.speed <= 0:
        return error(f"--speed {ns.speed}: must be positive")
    from tpuwatch.monitor.recording import recording_problem

    try:
        run_dir = rundir.find_run(ns.run)
    except FileNotFoundError as e:
        return error(str(e))
    problem = recording_problem(run_dir, missing_ok=True) or dashboard.nothing_to_show(run_dir)
    if problem:
        return error(problem)
    if not sys.stdout.isatty():  # a dashboard into a pipe: escape codes, waiting for keys forever
        return error(f"replay needs a terminal (stdout is not one); `tpuwatch report {rundir.reference(run_dir)}` prints "
                     "the run's summary and findings")
    dashboard.show(run_dir, live=False, speed=ns.speed)
    return 0

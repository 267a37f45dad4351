"""``tpuwatch export RUN --tensorboard LOGDIR``: a recorded run's series as TensorBoard scalars."""

from __future__ import annotations

import argparse
from pathlib import Path

from tpuwatch import rundir
from tpuwatch.commands import dashboard
from tpuwatch.commands.lines import error, say


def add_parser(sub) -> argparse.ArgumentParser:
    export = sub.add_parser("export", help="write a run's series for another tool: TensorBoard scalars")
    export.add_argument("run", nargs="?", help="run id or run directory (default: the latest run)")
    export.add_argument("--tensorboard", type=Path, metavar="LOGDIR", required=True,
                        help="write step time, input wait, each replica's loss and memory as TensorBoard scalars "
                             "into LOGDIR/tpuwatch-<run-id> (needs the tensorboard package; docs/tensorboard.md)")
    return export


def main(ns: argparse.Namespace) -> int:
    """``tpuwatch export RUN --tensorboard LOGDIR``: a recorded run's series as TensorBoard scalars."""
    from tpuwatch.console import tensorboard_export
    from tpuwatch.console.relay import relay_source
    from tpuwatch.monitor.group import worker_dirs

    try:
        run_dir = rundir.find_run(ns.run)
    except FileNotFoundError as e:
        return error(str(e))
    if problem := dashboard.nothing_to_show(run_dir) or tensorboard_export.problem(ns.tensorboard, run_dir.name):
        return error(problem)
    try:
        done = tensorboard_export.export(relay_source(run_dir), ns.tensorboard, run_dir.name,
                                         per_worker=worker_dirs(run_dir) is not None)
    except OSError as e:  # LOGDIR not writable, a file where its folder goes, a full disk: one line
        return error(f"--tensorboard {ns.tensorboard}: cannot write there ({e.strerror or e}); "
                     "give a directory you can write")
    if not done.points:
        say(f"{rundir.reference(run_dir)} has no step records or memory samples: nothing written")
        return 1
    say(f"wrote {sum(done.points.values()):,} scalars in {len(done.points)} series to {done.folder}; "
        f"see them with `tensorboard --logdir {ns.tensorboard}`")
    return 0

"""``tpuwatch ls [DIR]``: the runs under $TPUWATCH_HOME/runs, or in a directory of one's own (where
``tpuwatch run --run-dir`` put them)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from tpuwatch import rundir
from tpuwatch.commands.lines import error
from tpuwatch.printable import one_line


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("ls", help="list the runs under $TPUWATCH_HOME/runs, or in DIR (fitted to the terminal's width)")
    p.add_argument("dir", nargs="?", metavar="DIR",
                   help="a directory of runs (runs made with `tpuwatch run --run-dir DIR/NAME`), or one run's directory")
    return p


def main(ns: argparse.Namespace) -> int:
    from tpuwatch.console.run_list import render_run_list
    from tpuwatch.monitor.runs import list_runs, run_info

    if ns.dir is not None:
        root = Path(ns.dir)
        if not root.is_dir():
            return error(f"{ns.dir} is not a directory; give a directory of runs or a run's directory")
        runs = [run_info(root)] if rundir.is_run_dir(root) else list_runs(root)
    else:
        try:
            root = rundir.check_runs_root()
        except FileNotFoundError as e:
            return error(str(e))
        runs = list_runs(root)
    for bad in (r for r in runs if r.problem):  # a FIFO for run.json, ...: one line each, the rest listed
        print(one_line(f"tpuwatch: {bad.path.name}: {bad.problem}"), file=sys.stderr)
    runs = [r for r in runs if not r.problem]
    if not runs:
        print(one_line(f"no runs under {ns.dir if ns.dir is not None else rundir.runs_root()}; "
                       "start one with `tpuwatch run SCRIPT`"))
        return 0
    # A terminal (or an explicit $COLUMNS) gets rows that never wrap; a pipe gets everything.
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() or os.environ.get("COLUMNS") else None
    print(render_run_list(runs, width))
    return 0

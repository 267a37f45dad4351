"""``tpuwatch profile [RUN]`` and ``tpuwatch checkpoint [RUN]``: one command to a live agent, its result printed."""

from __future__ import annotations

import argparse

from tpuwatch import rundir
from tpuwatch.commands.lines import error

TIMEOUT_HELP = "seconds to wait for the result (default 300); then exit 1 (the run still does it: no cancel)"


def add_profile_parser(sub) -> argparse.ArgumentParser:
    profile = sub.add_parser("profile", help="capture a profile of a live run (TensorBoard/XProf format)")
    profile.add_argument("run", nargs="?", help="run id or run directory (default: the latest live run)")
    span = profile.add_mutually_exclusive_group()
    span.add_argument("--steps", type=int, help="training steps to capture (default 5)")
    span.add_argument("--ms", type=float, help="milliseconds to capture instead of a step count")
    profile.add_argument("--logdir",
                         help="where to write it: a directory or gs://bucket/path (default: the run's profiles/)")
    profile.add_argument("--timeout", type=float, default=300.0, help=TIMEOUT_HELP)
    return profile


def add_checkpoint_parser(sub) -> argparse.ArgumentParser:
    checkpoint = sub.add_parser("checkpoint", help="save a checkpoint of a live run at the next step boundary")
    checkpoint.add_argument("run", nargs="?", help="run id or run directory (default: the latest live run)")
    checkpoint.add_argument("--dir", help="a directory or gs://bucket/path (default: tpuwatch/ under the script's own "
                                          "checkpoint directory, else the run's checkpoints/)")
    checkpoint.add_argument("--timeout", type=float, default=300.0, help=TIMEOUT_HELP)
    return checkpoint


def main(ns: argparse.Namespace) -> int:
    """``tpuwatch profile`` / ``tpuwatch checkpoint``: one command to a live agent, its result printed."""
    from tpuwatch.control import actions
    from tpuwatch.monitor.runs import latest_live

    if not 0 < ns.timeout < float("inf"):
        return error(f"--timeout {ns.timeout:g}: give a positive number of seconds to wait for the result")
    if ns.command == "profile" and ns.steps is not None and ns.steps < 1:
        return error(f"--steps {ns.steps}: give a positive number of training steps to capture (default 5)")
    if ns.command == "profile" and ns.ms is not None and not 0 < ns.ms < float("inf"):
        return error(f"--ms {ns.ms:g}: give a positive number of milliseconds to capture")
    try:
        if ns.run is None:  # the live run, not a newer one that ended
            root = rundir.check_runs_root()
            live = latest_live(root)
            if live is None:
                return error(f"no run is live under {root}; start one with `tpuwatch run "
                             f"SCRIPT`, or name a run recorded elsewhere: `tpuwatch {ns.command} RUN_DIR`")
            run_dir = live
        else:
            run_dir = rundir.find_run(ns.run)
    except FileNotFoundError as e:
        return error(str(e))
    if ns.command == "profile":
        return actions.request(run_dir, "profile", timeout_s=ns.timeout, steps=ns.steps, ms=ns.ms,
                               logdir=ns.logdir)
    return actions.request(run_dir, "checkpoint", timeout_s=ns.timeout, dest_dir=ns.dir)

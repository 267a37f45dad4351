"""``tpuwatch attach [RUN | HOST:PORT... | @HOSTS]``: re-join a run, in the dashboard or, into a pipe
or a file, as progress lines."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

from tpuwatch import address, rundir, settings
from tpuwatch.commands import dashboard
from tpuwatch.commands.lines import bad_every, error, say
from tpuwatch.commands.outlets import Outlets, add_options
from tpuwatch.commands.streams import sleep_watching_stdout
from tpuwatch.monitor.runs import run_dir_alive
from tpuwatch.printable import printable


def add_parser(sub) -> argparse.ArgumentParser:
    attach = sub.add_parser("attach", help="re-join a run (the latest by default); into a pipe or file, its "
                                           "progress lines until it ends")
    attach.add_argument("run", nargs="*", metavar="RUN",
                        help="run id, run directory, or HOST:PORT of agents started with --listen (default: the latest run)")
    attach.add_argument("--token-file", type=Path, help="token file for HOST:PORT viewers (the run's `token`)")
    attach.add_argument("--summaries", choices=("auto", "on", "off"), default="auto",
                        help="HOST:PORT viewers: ask each agent for one summary a second instead of every record "
                             "(auto: with more than 16 hosts; worker 0 always sends every record; docs/multihost.md)")
    attach.add_argument("--every", type=float, default=5.0, metavar="SECONDS",
                        help="when stdout is not a terminal: at most one progress line every SECONDS, when "
                             "something moved (default 5), until the run ends; then its summary and its exit code")

    add_options(attach)
    return attach


def main(ns: argparse.Namespace) -> int:
    """``tpuwatch attach [RUN | HOST:PORT... | @HOSTS]``: catch up from the recording, then follow."""
    if (bad := bad_every(ns.every)) is not None:
        return bad
    if any(_is_address(r) or r.startswith("@") for r in ns.run):
        if ns.notify or ns.metrics or ns.tensorboard:
            return error("--notify, --metrics and --tensorboard work with a run recorded on this host; on each "
                         "training host, run `tpuwatch attach RUN --notify CMD --metrics PORT` (docs/alerts.md)")
        return _attach_remote(ns)
    if len(ns.run) > 1:
        return error("give one run id or directory (or HOST:PORT addresses of agents started with --listen)")
    try:
        run_dir = rundir.find_run(ns.run[0]) if ns.run else _latest_live_run()
    except FileNotFoundError as e:
        return error(str(e))
    problem = dashboard.nothing_to_show(run_dir)
    if problem:
        return error(problem)
    outlets = Outlets(ns)
    if problem := outlets.open(run_dir.name):
        return error(problem)
    try:
        headless = not sys.stdout.isatty()
        outlets.start(run_dir, partial(run_dir_alive, run_dir), quiet=not headless)
        if headless:  # into a pipe or a file: progress lines, not a dashboard waiting for keys
            return _attach_headless(run_dir, ns.every)
        return _after_attach(run_dir, dashboard.show(run_dir, live=True))
    finally:
        outlets.close()


def _attach_headless(run_dir: Path, every_s: float) -> int:
    """``tpuwatch attach RUN > file``: the headless progress lines on stdout (a run's own headless
    view writes them to stderr, beside the script's output) until the run ends, then its summary.
    Reads only: findings are recorded by the process that owns the run."""
    from tpuwatch.console import headless
    from tpuwatch.monitor.group import worker_dirs
    from tpuwatch.sources.group_source import GroupSource

    workers = worker_dirs(run_dir)
    alive = partial(run_dir_alive, run_dir)
    sleep = sleep_watching_stdout()
    if workers is None:
        snap = headless.follow(run_dir / rundir.EVENTS, alive, out=sys.stdout, every_s=every_s, sleep=sleep)
    else:
        source = GroupSource(workers)
        try:
            snap = headless.follow_group(source, alive, out=sys.stdout, every_s=every_s, sleep=sleep)
        finally:
            source.close()
    # The script's own code, as `tpuwatch run` exits with it; a run lost without one failed.
    if snap.exit_code is not None:
        return snap.exit_code
    return 1 if snap.status in ("lost", "crashed") else 0


def _after_attach(run_dir: Path, choice: str) -> int:
    """What the user chose when leaving ``tpuwatch attach``: say it, and stop training if asked."""
    from tpuwatch.control import run_stop
    from tpuwatch.monitor.group import worker_dirs
    from tpuwatch.monitor.runs import ended_state

    if choice == "detach":
        say(f"detached; training goes on. Re-join with `tpuwatch attach {rundir.reference(run_dir)}`")
        return 0
    if choice != "stop":
        return 0
    workers = worker_dirs(run_dir)
    dirs = [w.path for w in workers] if workers is not None else [run_dir]
    try:
        code = run_stop.stop_runs(dirs, by="tpuwatch attach", report=say)
    except run_stop.StopError as e:
        say(f"cannot stop the run: {e}")
        return 1
    say(f"training {ended_state(code, True)} (exit code {code}); "
        f"`tpuwatch report {rundir.reference(run_dir)}` for the full report")
    return code


def _latest_live_run() -> Path:
    """The newest running run; the newest run of any state when none is running."""
    from tpuwatch.monitor.runs import latest_live

    return latest_live(rundir.check_runs_root()) or rundir.find_run(None)


def _attach_remote(ns: argparse.Namespace) -> int:
    from tpuwatch.control.client import read_addresses

    try:
        addresses = read_addresses(ns.run)
    except ValueError as e:
        return error(str(e))
    token = settings.TOKEN.get()
    if ns.token_file is not None:
        try:
            token = rundir.read_token(ns.token_file)
        except OSError as e:
            return error(f"cannot read the token file {ns.token_file}: {e.strerror or e}")
    if not token:
        return error("HOST:PORT viewers need the run's token: pass --token-file (the `token` file in the run "
                     "directory on the training host) or set TPUWATCH_TOKEN")
    from tpuwatch.control.preflight import endpoint_problem
    from tpuwatch.sources.remote_source import make_remote_source
    from tpuwatch.ui.app import run_dashboard

    problems = [endpoint_problem(a, token) for a in addresses]
    if all(problems):  # nothing to show: say why, not a dashboard waiting forever
        for p in problems[:-1]:
            say(p)
        print(f"tpuwatch: {printable(problems[-1])}", file=sys.stderr)
        return 1
    if not sys.stdout.isatty():  # a dashboard into a pipe: escape codes, waiting for keys forever
        return error("attaching to HOST:PORT needs a terminal (stdout is not one); run it in a terminal, or "
                     "`tpuwatch attach RUN > FILE` on the training host for progress lines")
    source = make_remote_source(addresses, token, summary={"auto": None, "on": True, "off": False}[ns.summaries])
    names = ", ".join(f"{h}:{p}" for h, p in addresses[:3]) + (" ..." if len(addresses) > 3 else "")
    choice = run_dashboard(None, source, title=f"tpuwatch — {names}")
    if choice == "detach":
        say(f"detached; training goes on. Re-join with `tpuwatch attach {' '.join(ns.run)}`")
    elif choice == "stop":
        from tpuwatch.control.remote_stop import stop_remote

        return stop_remote([(s.address, s.offset) for s in source.streams], token, report=say)
    return 0


def _is_address(ref: str) -> bool:
    return address.looks_like(ref) and not Path(ref).exists()

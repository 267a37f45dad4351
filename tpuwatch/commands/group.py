"""``tpuwatch run --workers N``: N local workers, supervised as one group (docs/multihost.md)."""

from __future__ import annotations

import argparse
import sys

from tpuwatch import rundir
from tpuwatch.commands import dashboard
from tpuwatch.commands.interrupts import forward_interrupts
from tpuwatch.commands.lines import error, say
from tpuwatch.commands.outlets import Outlets
from tpuwatch.commands.streams import start_copier


def run_group(ns: argparse.Namespace, env: dict[str, str] | None, outlets: Outlets) -> int:
    """``tpuwatch run --workers N``: N local workers, supervised as one group (docs/multihost.md)."""
    from tpuwatch.control import group_launch, launcher

    if ns.workers is None:
        return error("--worker-grace needs --workers N")
    grace = group_launch.DEFAULT_GRACE_S if ns.worker_grace is None else ns.worker_grace
    launched: list = []

    def every_worker() -> list:
        if not launched:
            return []
        group = launched[0]
        for name in group.names:
            group.mark_stopping(name)
        return [w.process for w in group.workers]

    # From before the launch: a Ctrl-C while the workers start reaches them (interrupts.py)
    forwarding = forward_interrupts("every worker", every_worker)
    try:
        group = group_launch.start_group(ns.script, ns.args, ns.workers, module=ns.module, run_dir=ns.run_dir,
                                         python=ns.python, listen=ns.listen, sample_hz=ns.sample_hz, env=env,
                                         grace_s=grace)
    except launcher.LaunchError as e:
        return error(str(e))
    launched.append(group)
    forwarding.catch_up()
    merger = group_launch.OutputMerger(group).start()
    supervisor = group_launch.Supervisor(group, say=say).start()
    headless = ns.headless or not sys.stdout.isatty()
    outlets.start(group.run_dir, group.alive, quiet=not headless)
    try:
        # The dashboard's Ctrl-C is a key, its stop the dashboard's own; workers stopped as they
        # started have their end followed headless.
        if headless or not forwarding.hand_over():
            return _run_group_headless(group, supervisor, merger, ns.every)
        return _run_group_dashboard(group, supervisor, merger)
    finally:
        merger.close()


def _run_group_headless(group, supervisor, merger, every_s: float) -> int:
    from tpuwatch.console import headless
    from tpuwatch.monitor import group as groups
    from tpuwatch.monitor.recording import append
    from tpuwatch.sources.group_source import GroupSource

    pids = ", ".join(f"{n} pid {w.pid}" for n, w in zip(group.names, group.workers))
    say(f"run {group.run_id}: {len(group.workers)} workers ({pids}), recording in {group.run_dir}")
    done, copier = start_copier(group.run_dir / rundir.OUTPUT)
    dirs = {w.name: w.path for w in groups.worker_dirs(group.run_dir) or []}

    def record(findings) -> None:
        # Each finding goes into the recording of the worker it concerns (worker 0 for run-wide ones).
        for f in findings:
            path = dirs.get(f.worker) or dirs[group.names[0]]
            append(path / rundir.EVENTS, [f])

    source = GroupSource(groups.worker_dirs(group.run_dir) or [])
    try:
        headless.follow_group(source, group.alive, out=sys.stderr, every_s=every_s,
                              on_end=supervisor.wait, record_findings=record)
    finally:
        source.close()
    code = supervisor.wait()
    merger.close()
    done.set()
    copier.join(timeout=2)
    say(f"exit code {code}; `tpuwatch report {rundir.reference(group.run_dir)}` for the merged report")
    return code


def _run_group_dashboard(group, supervisor, merger) -> int:
    try:
        choice = dashboard.show(group.run_dir, live=True, owner=True)
    except KeyboardInterrupt:  # a SIGINT before the dashboard had the terminal (then Ctrl-C is its key)
        choice = "stop"
    if choice == "stop" and group.alive():
        from tpuwatch.control.run_stop import record_stop_request

        for w in group.workers:
            record_stop_request(w.run_dir, "the dashboard")
        code = group.stop(report=say)
        supervisor.wait()
    elif choice == "detach" and group.alive():
        say(f"detached; {len(group.workers)} workers go on (pids "
            f"{', '.join(str(w.pid) for w in group.workers)}), unsupervised: a dead worker's peers are not "
            f"stopped. Re-join with `tpuwatch attach {rundir.reference(group.run_dir)}`")
        return 0
    else:
        code = supervisor.wait()
    say(f"exit code {code}; `tpuwatch report {rundir.reference(group.run_dir)}` for the merged report")
    return code

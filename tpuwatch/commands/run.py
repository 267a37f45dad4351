"""``tpuwatch run SCRIPT``: start a script under the agent, then show the dashboard or the headless
lines until it ends (``--workers N``: :mod:`.group`)."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path
from typing import TextIO, cast

from tpuwatch import address, rundir, settings
from tpuwatch.commands import dashboard, group
from tpuwatch.commands.interrupts import forward_interrupts
from tpuwatch.commands.lines import EXIT_USAGE, bad_every, error, say
from tpuwatch.commands.outlets import Outlets, add_options
from tpuwatch.commands.streams import Unbreakable, quiet_stdout, start_copier
from tpuwatch.printable import one_line

#: Shortest TPUWATCH_TOKEN `tpuwatch run --listen` accepts (a generated one has 32).
MIN_TOKEN_CHARS = 16


def add_parser(sub) -> argparse.ArgumentParser:
    run = sub.add_parser("run", help="run a training script under the agent",
                         description="Run an unmodified TensorFlow training script under the tpuwatch agent. "
                                     "Options for tpuwatch go before the script; everything after it goes to the script.")
    run.add_argument("--headless", action="store_true",
                     help="print progress lines instead of opening the dashboard (default when stdout is not a "
                          "terminal): the script's stdout and stderr, merged as in output.log, go to stdout, "
                          "tpuwatch's own lines to stderr")
    run.add_argument("--run-dir", type=Path,
                     help="where to record the run: a new or empty directory (default: $TPUWATCH_HOME/runs/<id>); "
                          "a run outside $TPUWATCH_HOME/runs is not in `tpuwatch ls`: name it by its path")
    run.add_argument("--python", help="interpreter to run the script with (default: this one)")
    run.add_argument("--listen", default="", metavar="HOST:PORT",
                     help="also serve remote viewers over TCP (token in the run directory: TPUWATCH_TOKEN from the "
                          "environment when set, so one viewer opens every host of a job, else a random one); give "
                          "127.0.0.1:PORT and use SSH port forwarding (docs/remote.md, docs/multihost.md); checked "
                          "before the script starts")
    run.add_argument("--allow-dest", action="append", default=[], metavar="DIR",
                     help="a directory (or gs:// prefix) viewers may send checkpoints and profiles to, besides the "
                          "run directory and the script's checkpoint directory (repeatable)")
    run.add_argument("--sample-hz", type=float, default=None, help="agent sampling rate, 0.5-20 Hz (default 4)")
    run.add_argument("--no-auto-profile", dest="auto_profile", action="store_false",
                     help="do not capture a profile by itself: by default, when the step begins to wait for "
                          "input, the agent captures one of 1 s (once per episode, at most 3 a run; recorded under "
                          "profiles/ like any) to measure which tf.data stage the wait comes from")
    run.add_argument("--every", type=float, default=5.0, metavar="SECONDS",
                     help="headless: at most one progress line every SECONDS, when something moved (default 5)")
    run.add_argument("--workers", type=int, default=None, metavar="N",
                     help="start N MultiWorkerMirroredStrategy workers on this machine (TF_CONFIG with free "
                          "localhost ports), one agent each, shown merged (docs/multihost.md)")
    run.add_argument("--worker-grace", type=float, default=None, metavar="SECONDS",
                     help="with --workers: after a worker dies, stop the others this long after (default 15)")
    run.add_argument("--baseline", metavar="RUN",
                     help="a finished run (id or directory) to compare with as this one goes: the header and the "
                          "headless lines show the step p50, steps/s, examples/s and input wait deltas against its "
                          "whole-run figures (`tpuwatch compare` compares two runs in full afterwards)")
    add_options(run)
    run.add_argument("-m", dest="module", action="store_true", help="SCRIPT is a module name (like python -m)")
    run.add_argument("script", help="the training script (or module with -m)")
    # argparse counts a REMAINDER positional as required ("required: script, args"); the script is.
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script").required = False
    return run


def main(ns: argparse.Namespace) -> int:
    from tpuwatch.control import launcher

    if (bad := bad_every(ns.every)) is not None:
        return bad
    if ns.sample_hz is not None and not 0.5 <= ns.sample_hz <= 20:
        return error(f"--sample-hz {ns.sample_hz}: must be between 0.5 and 20")
    shared = settings.TOKEN.get()
    if ns.listen and shared and len(shared.strip()) < MIN_TOKEN_CHARS:
        # The token is all that guards a listening agent: a short shared one is guessable.
        return error(f"TPUWATCH_TOKEN has {len(shared.strip())} characters; a shared viewer token needs at least "
                     f"{MIN_TOKEN_CHARS} random ones, e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(24))'")
    env = None
    if ns.allow_dest:
        # The agent's command validation reads this (tpuwatch/agent/destinations.py).
        env = dict(os.environ)
        env[settings.ALLOWED_DESTINATIONS.name] = os.pathsep.join(
            d if d.startswith("gs://") else os.path.abspath(os.path.expanduser(d)) for d in ns.allow_dest)
    if not ns.auto_profile:
        # the agent leaves the probe out (its --disable default)
        env = dict(os.environ) if env is None else env
        env[settings.DISABLE.name] = ",".join(p for p in (env.get(settings.DISABLE.name, ""), "auto_profile") if p)
    if ns.listen:
        try:
            host = address.parse(ns.listen, listen=True)[0]
        except ValueError:
            host = ""  # the launcher names what is wrong with it
        if host in ("0.0.0.0", "::", "*"):
            say(f"warning: --listen {ns.listen} accepts viewers from every network this machine is on "
                "(anyone with the token can read the run and send commands); prefer 127.0.0.1:PORT with "
                "SSH port forwarding (docs/remote.md)")
    baseline = None
    if ns.baseline is not None:
        if ns.workers is not None:
            return error("--baseline is not available with --workers yet; compare afterwards with "
                         "`tpuwatch compare BASELINE RUN`")
        try:
            baseline = load_baseline(ns.baseline)
        except ValueError as e:
            return error(str(e))
    outlets = Outlets(ns)
    if problem := outlets.open():
        return error(problem)
    try:
        if ns.workers is not None or ns.worker_grace is not None:
            return group.run_group(ns, env, outlets)
        # From before the launch: a Ctrl-C while the training starts reaches it (interrupts.py)
        launched: list = []
        forwarding = forward_interrupts("the training process group", lambda: [x.process for x in launched])
        try:
            launch = launcher.start(ns.script, ns.args, module=ns.module, run_dir=ns.run_dir, python=ns.python,
                                    listen=ns.listen, sample_hz=ns.sample_hz, env=env)
        except launcher.LaunchError as e:
            return error(str(e))
        launched.append(launch)
        forwarding.catch_up()
        headless = ns.headless or not sys.stdout.isatty()
        outlets.start(launch.run_dir, launch.alive, quiet=not headless)
        # The dashboard's Ctrl-C is a key, its stop the dashboard's own; a training stopped as it
        # started has its end followed headless.
        if headless or not forwarding.hand_over():
            return _run_headless(launch, ns.every, baseline)
        return _run_dashboard(launch, baseline)
    finally:
        outlets.close()


def load_baseline(ref: str):
    """The whole-run figures of a finished run for ``run --baseline``; ValueError with one line
    when ``ref`` is not a run, or one without steps."""
    from tpuwatch.console import report
    from tpuwatch.monitor.baseline import Baseline

    try:
        data = report.build_report(rundir.find_run(ref))
    except (FileNotFoundError, report.ReportError) as e:
        raise ValueError(f"--baseline {ref}: {e}") from None
    s = data["summary"]
    ledger = data.get("ledger") or {}
    wall = ledger.get("wall_s") or 0.0
    shares = {k: v / wall for k, v in (ledger.get("buckets_s") or {}).items()} if wall > 0 else {}
    if not s.get("steps"):
        raise ValueError(f"--baseline {ref}: run {data['run']['id']} has no training steps to compare with")
    return Baseline(run_id=str(data["run"]["id"]), step_p50_s=s.get("step_time_p50_s"),
                    steps_per_s=s.get("steps_per_s"), examples_per_s=s.get("examples_per_s"),
                    input_wait_share=s.get("input_wait_share"), goodput=ledger.get("goodput"),
                    ledger_shares=shares)


def _run_headless(launch, every_s: float, baseline=None) -> int:
    from tpuwatch.console import headless
    from tpuwatch.control import launcher

    # `tpuwatch run x.py 2>&1 | head -3`: a reader that goes away must not kill the launcher
    # (the run would stay "running" and our exit code would not be the script's).
    guard = Unbreakable(sys.stderr)
    sys.stderr = cast(TextIO, guard)  # it quacks like one
    print(one_line(f"tpuwatch: run {launch.run_id} (pid {launch.pid}), recording in {launch.run_dir}"),
          file=sys.stderr)
    done, copier = start_copier(launch.run_dir / rundir.OUTPUT)
    codes: list[int] = []
    headless.follow(launch.run_dir / rundir.EVENTS, launch.alive, out=sys.stderr, every_s=every_s,
                    on_end=lambda: codes.append(launcher.finish(launch)), record_findings=True, baseline=baseline)
    code = codes[0] if codes else launcher.finish(launch)
    done.set()
    copier.join(timeout=2)
    _hint_misplaced_options(launch.run_dir, code)
    print(one_line(f"tpuwatch: exit code {code}; `tpuwatch report {rundir.reference(launch.run_dir)}` for the "
                   "full report"), file=sys.stderr)
    if guard.broken:
        quiet_stdout()  # the copier's stdout may be the same closed pipe: keep exit quiet
    return code


def _run_options() -> set[str]:
    """Every option string of `tpuwatch run` (`--headless`, `--every`, ...)."""
    run = add_parser(argparse.ArgumentParser().add_subparsers())
    return {o for action in run._actions for o in action.option_strings if o.startswith("--")}


def _hint_misplaced_options(run_dir: Path, code: int) -> None:
    """`tpuwatch run train.py --headless`: the script's argparse refused tpuwatch's option (exit 2,
    "unrecognized arguments: --headless"); say where tpuwatch's options go."""

    if code != EXIT_USAGE:
        return
    try:
        with rundir.open_regular(run_dir / rundir.OUTPUT) as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            tail = f.read(8192).decode("utf-8", "replace")
    except OSError:
        return
    ours = _run_options()
    for line in reversed(tail.splitlines()):
        if "unrecognized arguments:" in line:
            words = line.split("unrecognized arguments:", 1)[1].split()
            misplaced = [w for w in words if w.split("=", 1)[0] in ours]
            if misplaced:
                say(f"the script refused {' '.join(misplaced)}: that is tpuwatch's option, and tpuwatch's options "
                    f"go before the script (`tpuwatch run {' '.join(misplaced)} SCRIPT ARGS...`)")
            return


def _run_dashboard(launch, baseline=None) -> int:
    from tpuwatch.control import launcher

    # Records the end as soon as the child ends (a kill by a signal leaves no exit record of the
    # agent's own), so the dashboard shows it while it is still open.
    lock = threading.Lock()
    codes: list[int] = []

    def finish_once() -> int:
        with lock:
            if not codes:
                codes.append(launcher.finish(launch))
            return codes[0]

    def watch() -> None:
        launch.proc.wait()
        finish_once()

    threading.Thread(target=watch, name="tpuwatch-wait-child", daemon=True).start()
    try:
        choice = dashboard.show(launch.run_dir, live=True, owner=True, baseline=baseline)
    except KeyboardInterrupt:  # a SIGINT before the dashboard had the terminal (then Ctrl-C is its key)
        choice = "stop"
    if choice == "stop" and launch.alive():
        with lock:  # the watcher then finds the end recorded, and writes nothing twice
            if not codes:
                codes.append(launcher.stop(launch, report=say))
        code = codes[0]
    elif choice == "detach" and launch.alive():
        # A hangup lands here too: the terminal may be gone, so the message is best effort.
        say(one_line(f"detached; training goes on (pid {launch.pid}). "
                     f"Re-join with `tpuwatch attach {rundir.reference(launch.run_dir)}`"))
        return 0
    else:
        code = finish_once()
    _hint_misplaced_options(launch.run_dir, code)
    say(one_line(f"exit code {code}; `tpuwatch report {rundir.reference(launch.run_dir)}` for the full report"))
    return code

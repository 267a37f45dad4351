"""The ``tpuwatch`` command: run | attach | replay | report | compare | export | ls | profile | checkpoint | doctor.

Imports nothing heavy at module level: ``tpuwatch --help`` must stay fast and never needs
TensorFlow (the UI process never imports it at all).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TextIO, cast

from tpuwatch import __version__, address, settings
from tpuwatch.printable import printable

if TYPE_CHECKING:
    from tpuwatch.console.alerts import Alerts
    from tpuwatch.console.metrics_server import MetricsServer
    from tpuwatch.console.relay import Relay
    from tpuwatch.console.tensorboard_export import TensorBoardExport
    from tpuwatch.sources.source import Source

EXIT_USAGE = 2

DESCRIPTION = """\
Watch and diagnose TensorFlow training from the terminal.

  tpuwatch run train.py [ARGS]       start a script under the agent and open the dashboard
  tpuwatch run --headless train.py   progress lines instead of the dashboard (automatic when
                                     stdout is not a terminal)
  tpuwatch attach [RUN]              re-join a run (the latest by default)
  tpuwatch replay RUN                play a recorded run back
  tpuwatch report RUN                summary and findings of a run
  tpuwatch compare RUN_A RUN_B [...] runs side by side: figures, step-time difference with its
                                     95% interval, losses by step, findings, setup
  tpuwatch export RUN --tensorboard LOGDIR   its series as TensorBoard scalars
  tpuwatch ls                        list runs
  tpuwatch profile [RUN]             capture a profile of a live run now
  tpuwatch checkpoint [RUN]          save a checkpoint of a live run now
  tpuwatch doctor                    check TensorFlow, TPU, GCS and the run directory

Runs are recorded under $TPUWATCH_HOME/runs (default ~/.tpuwatch/runs), where run ids and
`tpuwatch ls` look; a run recorded elsewhere with `run --run-dir DIR` is named by its path.
"""


TIMEOUT_HELP = "seconds to wait for the result (default 300); then exit 1 (the run still does it: no cancel)"


class _Parser(argparse.ArgumentParser):
    """Bad input is one line naming what is wrong and where the help is (not the usage block).
    No abbreviations: `--headles` is refused, not taken for `--headless` (subcommands' parsers
    are of this class too)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"tpuwatch: {message}; see `{self.prog} --help`\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tpuwatch", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"tpuwatch {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

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
    _add_outlet_options(run)
    run.add_argument("-m", dest="module", action="store_true", help="SCRIPT is a module name (like python -m)")
    run.add_argument("script", help="the training script (or module with -m)")
    # argparse counts a REMAINDER positional as required ("required: script, args"); the script is.
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script").required = False

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

    _add_outlet_options(attach)

    replay = sub.add_parser("replay", help="play a recorded run back in the dashboard (needs a terminal; "
                                           "`tpuwatch report` prints a run's summary)")
    replay.add_argument("run", nargs="?", help="run id or run directory (default: the latest run)")
    replay.add_argument("--speed", type=float, default=1.0, help="playback speed (default 1x: as it ran)")

    report = sub.add_parser("report", help="summary and findings of a run")
    report.add_argument("run", nargs="?", help="run id or run directory (default: the latest run)")
    report.add_argument("--format", choices=("text", "markdown", "json"), default="text")

    export = sub.add_parser("export", help="write a run's series for another tool: TensorBoard scalars")
    export.add_argument("run", nargs="?", help="run id or run directory (default: the latest run)")
    export.add_argument("--tensorboard", type=Path, metavar="LOGDIR", required=True,
                        help="write step time, input wait, each replica's loss and memory as TensorBoard scalars "
                             "into LOGDIR/tpuwatch-<run-id> (needs the tensorboard package; docs/tensorboard.md)")

    compare = sub.add_parser(
        "compare", help="runs side by side, each against the first",
        description="Compare finished (or running) runs, each against the first: wall time, step time p50/p95, "
                    "steps/s, examples/s, input wait; the difference of the step-time medians with a 95% "
                    "confidence interval (moving-block bootstrap over steps, fixed seed; \"no significant "
                    "difference\" when it includes zero); the losses aligned by step in one chart; findings in "
                    "one run and not the other; differences in TF/Keras versions, strategy, replicas, batch size, "
                    "argv. What cannot be compared (a run without steps, different scripts or replica counts, a "
                    "crashed run) is said in one line.")
    compare.add_argument("runs", nargs="+", metavar="RUN", help="run ids or run directories (at least two)")
    compare.add_argument("--format", choices=("text", "markdown", "json"), default="text")

    sub.add_parser("ls", help="list the runs under $TPUWATCH_HOME/runs (fitted to the terminal's width)")

    profile = sub.add_parser("profile", help="capture a profile of a live run (TensorBoard/XProf format)")
    profile.add_argument("run", nargs="?", help="run id or run directory (default: the latest live run)")
    span = profile.add_mutually_exclusive_group()
    span.add_argument("--steps", type=int, help="training steps to capture (default 5)")
    span.add_argument("--ms", type=float, help="milliseconds to capture instead of a step count")
    profile.add_argument("--logdir",
                         help="where to write it: a directory or gs://bucket/path (default: the run's profiles/)")
    profile.add_argument("--timeout", type=float, default=300.0, help=TIMEOUT_HELP)

    checkpoint = sub.add_parser("checkpoint", help="save a checkpoint of a live run at the next step boundary")
    checkpoint.add_argument("run", nargs="?", help="run id or run directory (default: the latest live run)")
    checkpoint.add_argument("--dir", help="a directory or gs://bucket/path (default: the script's own checkpoint "
                                          "directory, else the run's checkpoints/)")
    checkpoint.add_argument("--timeout", type=float, default=300.0, help=TIMEOUT_HELP)

    doctor = sub.add_parser("doctor", help="check the environment you are about to train in")
    doctor.add_argument("--python", help="interpreter the training will use (default: this one)")
    doctor.add_argument("--gcs", metavar="gs://BUCKET[/PATH]", help="also check this GCS destination")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    ns, unknown = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if unknown:
        where = f"tpuwatch {ns.command}" if ns.command else "tpuwatch"
        kind = "option" if unknown[0].startswith("-") else "argument"
        order = " (tpuwatch's options go before the script, the script's after it)" if ns.command == "run" else ""
        return _error(f"unrecognized {kind} {unknown[0]} for `{where}`{order}; see `{where} --help`")
    if ns.command is None:
        parser.print_help()
        return EXIT_USAGE
    handler = {"run": cmd_run, "attach": cmd_attach, "replay": cmd_replay, "report": cmd_report,
               "compare": cmd_compare, "export": cmd_export, "ls": cmd_ls, "profile": cmd_action,
               "checkpoint": cmd_action, "doctor": cmd_doctor}[ns.command]
    from tpuwatch import rundir

    try:
        return shell_exit_code(handler(ns))
    except rundir.RunDirError as e:  # a home another user could write into, ...: one line, never a traceback
        return _error(str(e.strerror))
    except PermissionError as e:
        return _error(f"cannot access {e.filename or 'a file'}: permission denied; run tpuwatch as the user "
                      "who owns the run (or give a run of your own)")
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `tpuwatch ls | head`: the reader has had enough. Quiet, like other Unix tools; stdout
        # goes to /dev/null so the interpreter's final flush cannot raise again.
        _quiet_stdout()
        return 141  # 128 + SIGPIPE, what a shell shows for a tool killed by it


def shell_exit_code(code: int) -> int:
    """A command's exit code as a shell can see it (0-255): a recorded code outside that range
    (a crafted recording's 256, a ``Popen``-style -9) is never truncated into success: -N for
    signal N is 128+N, anything else out of range is 1."""
    if 0 <= code <= 255:
        return code
    if -64 < code < 0:
        return 128 - code
    return 1


def _quiet_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _error(message: str) -> int:
    print(f"tpuwatch: {printable(message)}", file=sys.stderr)  # it may quote a run's id or path
    return EXIT_USAGE


#: Shortest TPUWATCH_TOKEN `tpuwatch run --listen` accepts (a generated one has 32).
MIN_TOKEN_CHARS = 16


def _ref(run_dir: Path) -> str:
    """``run_dir`` as other tpuwatch commands take it (a --run-dir outside the runs home by its path)."""
    from tpuwatch import rundir

    return rundir.reference(run_dir)


def _find_run(ref: str | None) -> Path:
    from tpuwatch import rundir

    return rundir.find_run(ref)


# --- run -----------------------------------------------------------------------------------------


def _bad_every(every: float) -> int | None:
    """The usage error for an --every that is not a positive, finite number (NaN too), else None."""
    if 0 < every < float("inf"):
        return None
    return _error(f"--every {every:g}: give a positive number of seconds between progress lines")


def cmd_run(ns: argparse.Namespace) -> int:
    from tpuwatch.control import launcher

    if (bad := _bad_every(ns.every)) is not None:
        return bad
    if ns.sample_hz is not None and not 0.5 <= ns.sample_hz <= 20:
        return _error(f"--sample-hz {ns.sample_hz}: must be between 0.5 and 20")
    shared = settings.TOKEN.get()
    if ns.listen and shared and len(shared.strip()) < MIN_TOKEN_CHARS:
        # The token is all that guards a listening agent: a short shared one is guessable.
        return _error(f"TPUWATCH_TOKEN has {len(shared.strip())} characters; a shared viewer token needs at least "
                      f"{MIN_TOKEN_CHARS} random ones, e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(24))'")
    env = None
    if ns.allow_dest:
        # The agent's command validation reads this (tpuwatch/agent/destinations.py).
        env = dict(os.environ)
        env[settings.ALLOWED_DESTINATIONS.name] = os.pathsep.join(
            d if d.startswith("gs://") else os.path.abspath(os.path.expanduser(d)) for d in ns.allow_dest)
    if ns.listen:
        try:
            host = address.parse(ns.listen, listen=True)[0]
        except ValueError:
            host = ""  # the launcher names what is wrong with it
        if host in ("0.0.0.0", "::", "*"):
            _say(f"warning: --listen {ns.listen} accepts viewers from every network this machine is on "
                 "(anyone with the token can read the run and send commands); prefer 127.0.0.1:PORT with "
                 "SSH port forwarding (docs/remote.md)")
    baseline = None
    if ns.baseline is not None:
        if ns.workers is not None:
            return _error("--baseline is not available with --workers yet; compare afterwards with "
                          "`tpuwatch compare BASELINE RUN`")
        try:
            baseline = _load_baseline(ns.baseline)
        except ValueError as e:
            return _error(str(e))
    outlets = _Outlets(ns)
    if problem := outlets.open():
        return _error(problem)
    try:
        if ns.workers is not None or ns.worker_grace is not None:
            return _run_group(ns, env, outlets)
        try:
            launch = launcher.start(ns.script, ns.args, module=ns.module, run_dir=ns.run_dir, python=ns.python,
                                    listen=ns.listen, sample_hz=ns.sample_hz, env=env)
        except launcher.LaunchError as e:
            return _error(str(e))
        headless = ns.headless or not sys.stdout.isatty()
        outlets.start(launch.run_dir, launch.alive, quiet=not headless)
        if headless:
            return _run_headless(launch, ns.every, baseline)
        return _run_dashboard(launch, baseline)
    finally:
        outlets.close()


def _load_baseline(ref: str):
    """The whole-run figures of a finished run for ``run --baseline``; ValueError with one line
    when ``ref`` is not a run, or one without steps."""
    from tpuwatch.console import report
    from tpuwatch.monitor.baseline import Baseline

    try:
        data = report.build_report(_find_run(ref))
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
    from tpuwatch import rundir
    from tpuwatch.console import headless
    from tpuwatch.control import launcher

    # `tpuwatch run x.py 2>&1 | head -3`: a reader that goes away must not kill the launcher
    # (the run would stay "running" and our exit code would not be the script's).
    guard = _Unbreakable(sys.stderr)
    sys.stderr = cast(TextIO, guard)  # it quacks like one
    print(f"tpuwatch: run {launch.run_id} (pid {launch.pid}), recording in {launch.run_dir}", file=sys.stderr)
    done, copier = _start_copier(launch.run_dir / rundir.OUTPUT)
    _forward_interrupts("the training process group", lambda: [launch.process])
    codes: list[int] = []
    headless.follow(launch.run_dir / rundir.EVENTS, launch.alive, out=sys.stderr, every_s=every_s,
                    on_end=lambda: codes.append(launcher.finish(launch)), record_findings=True, baseline=baseline)
    code = codes[0] if codes else launcher.finish(launch)
    done.set()
    copier.join(timeout=2)
    _hint_misplaced_options(launch.run_dir, code)
    print(f"tpuwatch: exit code {code}; `tpuwatch report {_ref(launch.run_dir)}` for the full report", file=sys.stderr)
    if guard.broken:
        _quiet_stdout()  # the copier's stdout may be the same closed pipe: keep exit quiet
    return code


def _run_options() -> set[str]:
    """Every option string of `tpuwatch run` (`--headless`, `--every`, ...)."""
    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {o for action in commands.choices["run"]._actions for o in action.option_strings if o.startswith("--")}


def _hint_misplaced_options(run_dir: Path, code: int) -> None:
    """`tpuwatch run train.py --headless`: the script's argparse refused tpuwatch's option (exit 2,
    "unrecognized arguments: --headless"); say where tpuwatch's options go."""
    from tpuwatch import rundir

    if code != EXIT_USAGE:
        return
    try:
        with open(run_dir / rundir.OUTPUT, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return
    ours = _run_options()
    for line in reversed(tail.splitlines()):
        if "unrecognized arguments:" in line:
            words = line.split("unrecognized arguments:", 1)[1].split()
            misplaced = [w for w in words if w.split("=", 1)[0] in ours]
            if misplaced:
                _say(f"the script refused {' '.join(misplaced)}: that is tpuwatch's option, and tpuwatch's options "
                     f"go before the script (`tpuwatch run {' '.join(misplaced)} SCRIPT ARGS...`)")
            return


class _Unbreakable:
    """A text stream whose writes and flushes never raise (the reader has gone: drop the text)."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                self._stream.write(text)
            except (OSError, ValueError):
                self.broken = True
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self.broken = True

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _run_group(ns: argparse.Namespace, env: dict[str, str] | None, outlets: "_Outlets") -> int:
    """``tpuwatch run --workers N``: N local workers, supervised as one group (docs/multihost.md)."""
    from tpuwatch.control import group_launch, launcher

    if ns.workers is None:
        return _error("--worker-grace needs --workers N")
    grace = group_launch.DEFAULT_GRACE_S if ns.worker_grace is None else ns.worker_grace
    try:
        group = group_launch.start_group(ns.script, ns.args, ns.workers, module=ns.module, run_dir=ns.run_dir,
                                         python=ns.python, listen=ns.listen, sample_hz=ns.sample_hz, env=env,
                                         grace_s=grace)
    except launcher.LaunchError as e:
        return _error(str(e))
    merger = group_launch.OutputMerger(group).start()
    supervisor = group_launch.Supervisor(group, say=_say).start()
    headless = ns.headless or not sys.stdout.isatty()
    outlets.start(group.run_dir, group.alive, quiet=not headless)
    try:
        if headless:
            return _run_group_headless(group, supervisor, merger, ns.every)
        return _run_group_dashboard(group, supervisor, merger)
    finally:
        merger.close()


def _run_group_headless(group, supervisor, merger, every_s: float) -> int:
    from tpuwatch import rundir
    from tpuwatch.console import headless
    from tpuwatch.monitor import group as groups
    from tpuwatch.monitor.recording import append
    from tpuwatch.sources.group_source import GroupSource

    pids = ", ".join(f"{n} pid {w.pid}" for n, w in zip(group.names, group.workers))
    _say(f"run {group.run_id}: {len(group.workers)} workers ({pids}), recording in {group.run_dir}")
    done, copier = _start_copier(group.run_dir / rundir.OUTPUT)

    def every_worker() -> list:
        for name in group.names:
            group.mark_stopping(name)
        return [w.process for w in group.workers]

    _forward_interrupts("every worker", every_worker)
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
    _say(f"exit code {code}; `tpuwatch report {_ref(group.run_dir)}` for the merged report")
    return code


def _run_group_dashboard(group, supervisor, merger) -> int:
    choice = _dashboard(group.run_dir, live=True, owner=True)
    if choice == "stop" and group.alive():
        from tpuwatch.control.run_stop import record_stop_request

        for w in group.workers:
            record_stop_request(w.run_dir, "the dashboard")
        code = group.stop(report=_say)
        supervisor.wait()
    elif choice == "detach" and group.alive():
        _say(f"detached; {len(group.workers)} workers go on (pids "
             f"{', '.join(str(w.pid) for w in group.workers)}), unsupervised: a dead worker's peers are not "
             f"stopped. Re-join with `tpuwatch attach {_ref(group.run_dir)}`")
        return 0
    else:
        code = supervisor.wait()
    _say(f"exit code {code}; `tpuwatch report {_ref(group.run_dir)}` for the merged report")
    return code


def _start_copier(path: Path) -> tuple[threading.Event, threading.Thread]:
    """Copies the script's output to our stdout until the returned event is set."""
    done = threading.Event()
    copier = threading.Thread(target=_copy_output, args=(path, done), daemon=True)
    copier.start()
    return done, copier


def _forward_interrupts(what: str, targets) -> None:
    """Ctrl-C (or SIGTERM) sends SIGINT to the training, again SIGTERM, then SIGKILL; a hangup
    (SSH drop) is ignored: it must not end the training. ``targets()`` gives the processes
    (:class:`tpuwatch.monitor.runs.Process`): whether each group lives, and each signal, is
    decided there (a pid reused by another process after the run's ended gets nothing).

    A script that ignores SIGINT (started with ``nohup`` or ``&``) is escalated without a second
    Ctrl-C: SIGTERM after the grace period (``TPUWATCH_STOP_GRACE_S``, default 15 s), SIGKILL
    the same time later, each said on stderr."""
    interrupts = 0
    lock = threading.RLock()  # the signal handler may interrupt the main thread inside send()
    grace = _stop_grace_s()

    def send(level: int) -> None:
        nonlocal interrupts
        with lock:
            if level <= interrupts:
                return  # a Ctrl-C already went further
            interrupts = level
        sig = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)[min(level, 3) - 1]
        processes = list(targets())
        _say(f"sending {sig.name} to {what}" + (" (Ctrl-C again to escalate)" if level < 3 else ""))
        for process in processes:
            process.signal(sig)
        if level < 3:
            threading.Thread(target=escalate, args=(level, processes), name="tpuwatch-escalate", daemon=True).start()

    def escalate(level: int, processes: list) -> None:
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not any(p.group_alive() for p in processes) or interrupts > level:
                return
            time.sleep(0.1)
        if any(p.group_alive() for p in processes) and interrupts == level:
            _say(f"{what} still running {grace:g} s after {('SIGINT', 'SIGTERM')[level - 1]}")
            send(level + 1)

    def on_signal(signum, frame):
        send(interrupts + 1)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _stop_grace_s() -> float:
    return settings.STOP_GRACE_S.positive_float()


def _copy_output(path: Path, done: threading.Event) -> None:
    """Copies the script's output.log to our stdout as it grows (the script's output still reaches the user)."""
    out = sys.stdout.buffer
    with open(path, "rb") as f:
        while True:
            chunk = f.read(65536)
            if chunk:
                try:
                    out.write(chunk)
                    out.flush()
                except (BrokenPipeError, ValueError):
                    _quiet_stdout()  # else the interpreter's last flush fails too (exit 120)
                    return
                continue
            if done.is_set():
                return
            time.sleep(0.1)


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
    choice = _dashboard(launch.run_dir, live=True, owner=True, baseline=baseline)
    if choice == "stop" and launch.alive():
        with lock:  # the watcher then finds the end recorded, and writes nothing twice
            if not codes:
                codes.append(launcher.stop(launch, report=_say))
        code = codes[0]
    elif choice == "detach" and launch.alive():
        # A hangup lands here too: the terminal may be gone, so the message is best effort.
        _say(f"detached; training goes on (pid {launch.pid}). Re-join with `tpuwatch attach {_ref(launch.run_dir)}`")
        return 0
    else:
        code = finish_once()
    _hint_misplaced_options(launch.run_dir, code)
    _say(f"exit code {code}; `tpuwatch report {_ref(launch.run_dir)}` for the full report")
    return code


def _say(line: str) -> None:
    """A status line on stderr; a closed terminal (hangup) is not an error worth a traceback."""
    try:
        print(f"tpuwatch: {printable(line)}", file=sys.stderr, flush=True)
    except OSError:
        pass


def _dashboard(run_dir: Path, live: bool, speed: float | None = None, owner: bool = False,
               baseline=None) -> str:
    """Opens the dashboard on a run: live (tail the recording, send commands) or a replay.

    ``owner``: this process started the run, so it writes the findings into the recording.
    """
    from tpuwatch.monitor.group import worker_dirs
    from tpuwatch.ui.app import run_dashboard

    source: Source
    workers = worker_dirs(run_dir)
    if workers is not None:
        from tpuwatch.sources.group_source import (
            make_group_replay_source,
            make_group_source,
        )

        source = make_group_source(workers) if live else make_group_replay_source(workers, speed=speed or 1.0)
        # Findings go into the workers' recordings (owner only), not into the group directory.
        return run_dashboard(run_dir, source, record_findings=False)
    if live:
        from tpuwatch.control.client import AgentClient
        from tpuwatch.sources.file_source import make_file_source

        client = AgentClient.for_run(run_dir)
        source = make_file_source(run_dir, send=client.send)
    else:
        from tpuwatch.sources.replay_source import make_replay_source

        source = make_replay_source(run_dir, speed=speed or 1.0)
    return run_dashboard(run_dir, source, record_findings=owner, baseline=baseline)


# --- attach / replay / report / ls ---------------------------------------------------------------


def cmd_attach(ns: argparse.Namespace) -> int:
    """``tpuwatch attach [RUN | HOST:PORT... | @HOSTS]``: catch up from the recording, then follow."""
    if (bad := _bad_every(ns.every)) is not None:
        return bad
    if any(_is_address(r) or r.startswith("@") for r in ns.run):
        if ns.notify or ns.metrics or ns.tensorboard:
            return _error("--notify, --metrics and --tensorboard work with a run recorded on this host; on each "
                          "training host, run `tpuwatch attach RUN --notify CMD --metrics PORT` (docs/alerts.md)")
        return _attach_remote(ns)
    if len(ns.run) > 1:
        return _error("give one run id or directory (or HOST:PORT addresses of agents started with --listen)")
    try:
        run_dir = _find_run(ns.run[0]) if ns.run else _latest_live_run()
    except FileNotFoundError as e:
        return _error(str(e))
    problem = _nothing_to_show(run_dir)
    if problem:
        return _error(problem)
    outlets = _Outlets(ns)
    if problem := outlets.open(run_dir.name):
        return _error(problem)
    try:
        headless = not sys.stdout.isatty()
        outlets.start(run_dir, _run_dir_alive(run_dir), quiet=not headless)
        if headless:  # into a pipe or a file: progress lines, not a dashboard waiting for keys
            return _attach_headless(run_dir, ns.every)
        return _after_attach(run_dir, _dashboard(run_dir, live=True))
    finally:
        outlets.close()


def _attach_headless(run_dir: Path, every_s: float) -> int:
    """``tpuwatch attach RUN > file``: the headless progress lines on stdout (a run's own headless
    view writes them to stderr, beside the script's output) until the run ends, then its summary.
    Reads only: findings are recorded by the process that owns the run."""
    from tpuwatch import rundir
    from tpuwatch.console import headless
    from tpuwatch.monitor.group import worker_dirs
    from tpuwatch.sources.group_source import GroupSource

    workers = worker_dirs(run_dir)
    alive = _run_dir_alive(run_dir)
    sleep = _sleep_watching_stdout()
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


def _run_dir_alive(run_dir: Path) -> Callable[[], bool]:
    """Whether the run recorded in ``run_dir`` (any of its workers) still runs, asked anew each call."""
    from tpuwatch import rundir
    from tpuwatch.monitor.group import worker_dirs
    from tpuwatch.monitor.runs import run_alive

    workers = worker_dirs(run_dir)
    dirs = [w.path for w in workers] if workers is not None else [run_dir]
    return lambda: any(run_alive(rundir.read_meta(d)) for d in dirs)


def _sleep_watching_stdout() -> Callable[[float], None]:
    """``time.sleep`` that ends with BrokenPipeError once stdout's reader has gone (`| head`):
    a quiet run writes nothing for a long time, and the pipeline would wait for it. A pipe's
    writer sees POLLERR when its last reader closes; a file or a terminal never does."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLERR)
    except (AttributeError, OSError, ValueError):
        return time.sleep

    def sleep(seconds: float) -> None:
        if poller.poll(max(0, int(seconds * 1000))):
            raise BrokenPipeError("stdout's reader has gone")

    return sleep


def _nothing_to_show(run_dir: Path) -> str:
    """Why a viewer of ``run_dir`` could show nothing at all ("" when it can)."""
    from tpuwatch.control.preflight import recording_problem
    from tpuwatch.monitor.group import worker_dirs

    workers = worker_dirs(run_dir)
    problems = [recording_problem(w.path) for w in workers] if workers is not None else [recording_problem(run_dir)]
    return problems[0] if problems and all(problems) else ""


def _after_attach(run_dir: Path, choice: str) -> int:
    """What the user chose when leaving ``tpuwatch attach``: say it, and stop training if asked."""
    from tpuwatch.control import run_stop
    from tpuwatch.monitor.group import worker_dirs
    from tpuwatch.monitor.runs import ended_state

    if choice == "detach":
        _say(f"detached; training goes on. Re-join with `tpuwatch attach {_ref(run_dir)}`")
        return 0
    if choice != "stop":
        return 0
    workers = worker_dirs(run_dir)
    dirs = [w.path for w in workers] if workers is not None else [run_dir]
    try:
        code = run_stop.stop_runs(dirs, by="tpuwatch attach", report=_say)
    except run_stop.StopError as e:
        _say(f"cannot stop the run: {e}")
        return 1
    _say(f"training {ended_state(code, True)} (exit code {code}); "
         f"`tpuwatch report {_ref(run_dir)}` for the full report")
    return code


def _latest_live_run() -> Path:
    """The newest running run; the newest run of any state when none is running."""
    from tpuwatch import rundir
    from tpuwatch.monitor.runs import list_runs

    running = [r for r in list_runs(rundir.check_runs_root()) if r.state == "running"]
    return running[0].path if running else _find_run(None)


def _attach_remote(ns: argparse.Namespace) -> int:
    from tpuwatch import rundir
    from tpuwatch.control.client import read_addresses

    try:
        addresses = read_addresses(ns.run)
    except ValueError as e:
        return _error(str(e))
    token = settings.TOKEN.get()
    if ns.token_file is not None:
        try:
            token = rundir.read_token(ns.token_file)
        except OSError as e:
            return _error(f"cannot read the token file {ns.token_file}: {e.strerror or e}")
    if not token:
        return _error("HOST:PORT viewers need the run's token: pass --token-file (the `token` file in the run "
                      "directory on the training host) or set TPUWATCH_TOKEN")
    from tpuwatch.control.preflight import endpoint_problem
    from tpuwatch.sources.remote_source import make_remote_source
    from tpuwatch.ui.app import run_dashboard

    problems = [endpoint_problem(a, token) for a in addresses]
    if all(problems):  # nothing to show: say why, not a dashboard waiting forever
        for p in problems[:-1]:
            _say(p)
        print(f"tpuwatch: {printable(problems[-1])}", file=sys.stderr)
        return 1
    if not sys.stdout.isatty():  # a dashboard into a pipe: escape codes, waiting for keys forever
        return _error("attaching to HOST:PORT needs a terminal (stdout is not one); run it in a terminal, or "
                      "`tpuwatch attach RUN > FILE` on the training host for progress lines")
    source = make_remote_source(addresses, token, summary={"auto": None, "on": True, "off": False}[ns.summaries])
    names = ", ".join(f"{h}:{p}" for h, p in addresses[:3]) + (" ..." if len(addresses) > 3 else "")
    choice = run_dashboard(None, source, title=f"tpuwatch — {names}")
    if choice == "detach":
        _say(f"detached; training goes on. Re-join with `tpuwatch attach {' '.join(ns.run)}`")
    elif choice == "stop":
        from tpuwatch.control.remote_stop import stop_remote

        return stop_remote([(s.address, s.offset) for s in source.streams], token, report=_say)
    return 0


def _is_address(ref: str) -> bool:
    return address.looks_like(ref) and not Path(ref).exists()


def cmd_action(ns: argparse.Namespace) -> int:
    """``tpuwatch profile`` / ``tpuwatch checkpoint``: one command to a live agent, its result printed."""
    from tpuwatch import rundir
    from tpuwatch.control import actions
    from tpuwatch.monitor.runs import list_runs

    if not 0 < ns.timeout < float("inf"):
        return _error(f"--timeout {ns.timeout:g}: give a positive number of seconds to wait for the result")
    if ns.command == "profile" and ns.steps is not None and ns.steps < 1:
        return _error(f"--steps {ns.steps}: give a positive number of training steps to capture (default 5)")
    if ns.command == "profile" and ns.ms is not None and not 0 < ns.ms < float("inf"):
        return _error(f"--ms {ns.ms:g}: give a positive number of milliseconds to capture")
    try:
        if ns.run is None:  # the live run, not a newer one that ended (issue 28)
            root = rundir.check_runs_root()
            running = [r for r in list_runs(root) if r.state == "running"]
            if not running:
                return _error(f"no run is live under {root}; start one with `tpuwatch run "
                              f"SCRIPT`, or name a run recorded elsewhere: `tpuwatch {ns.command} RUN_DIR`")
            run_dir = running[0].path
        else:
            run_dir = _find_run(ns.run)
    except FileNotFoundError as e:
        return _error(str(e))
    if ns.command == "profile":
        return actions.request(run_dir, "profile", timeout_s=ns.timeout, steps=ns.steps, ms=ns.ms,
                               logdir=ns.logdir)
    return actions.request(run_dir, "checkpoint", timeout_s=ns.timeout, dest_dir=ns.dir)


def cmd_doctor(ns: argparse.Namespace) -> int:
    from tpuwatch.console import doctor

    return doctor.main(python=ns.python, gcs=ns.gcs)


def cmd_replay(ns: argparse.Namespace) -> int:
    if ns.speed <= 0:
        return _error(f"--speed {ns.speed}: must be positive")
    from tpuwatch.console.report import recording_problem

    try:
        run_dir = _find_run(ns.run)
    except FileNotFoundError as e:
        return _error(str(e))
    problem = recording_problem(run_dir) or _nothing_to_show(run_dir)
    if problem:
        return _error(problem)
    if not sys.stdout.isatty():  # a dashboard into a pipe: escape codes, waiting for keys forever
        return _error(f"replay needs a terminal (stdout is not one); `tpuwatch report {_ref(run_dir)}` prints "
                      "the run's summary and findings")
    _dashboard(run_dir, live=False, speed=ns.speed)
    return 0


def cmd_report(ns: argparse.Namespace) -> int:
    from tpuwatch.console import report

    try:
        run_dir = _find_run(ns.run)
    except FileNotFoundError as e:
        return _error(str(e))
    try:
        data = report.build_report(run_dir)
    except report.ReportError as e:
        return _error(str(e))
    if ns.format == "json":
        print(report.render_json(data))
    elif ns.format == "markdown":
        print(report.render_markdown(data))
    else:
        print(report.render_text(data))
    return 0


def cmd_export(ns: argparse.Namespace) -> int:
    """``tpuwatch export RUN --tensorboard LOGDIR``: a recorded run's series as TensorBoard scalars."""
    from tpuwatch.console import tensorboard_export
    from tpuwatch.console.relay import relay_source
    from tpuwatch.monitor.group import worker_dirs

    try:
        run_dir = _find_run(ns.run)
    except FileNotFoundError as e:
        return _error(str(e))
    if problem := _nothing_to_show(run_dir) or tensorboard_export.problem(ns.tensorboard, run_dir.name):
        return _error(problem)
    try:
        done = tensorboard_export.export(relay_source(run_dir), ns.tensorboard, run_dir.name,
                                         per_worker=worker_dirs(run_dir) is not None)
    except OSError as e:  # LOGDIR not writable, a file where its folder goes, a full disk: one line
        return _error(f"--tensorboard {ns.tensorboard}: cannot write there ({e.strerror or e}); "
                      "give a directory you can write")
    if not done.points:
        _say(f"{_ref(run_dir)} has no step records or memory samples: nothing written")
        return 1
    _say(f"wrote {sum(done.points.values()):,} scalars in {len(done.points)} series to {done.folder}; "
         f"see them with `tensorboard --logdir {ns.tensorboard}`")
    return 0


def cmd_compare(ns: argparse.Namespace) -> int:
    from tpuwatch.console import compare, report

    if len(ns.runs) < 2:
        return _error("compare needs at least two runs (run ids or run directories)")
    if len(ns.runs) > len(compare.MARKS):
        return _error(f"compare takes at most {len(compare.MARKS)} runs, got {len(ns.runs)}")
    runs = []
    for i, ref in enumerate(ns.runs):
        label = chr(ord("A") + i)
        try:
            runs.append(compare.load(label, _find_run(ref)))
        except (FileNotFoundError, report.ReportError) as e:
            return _error(f"run {label} ({ref}): {e}")
    data = compare.compare(runs)
    render = {"json": compare.render_json, "markdown": compare.render_markdown}.get(ns.format, compare.render_text)
    print(render(data), end="" if ns.format != "json" else "\n")
    return 0


def cmd_ls(ns: argparse.Namespace) -> int:
    from tpuwatch import rundir
    from tpuwatch.console.run_list import render_run_list
    from tpuwatch.monitor.runs import list_runs

    try:
        root = rundir.check_runs_root()
    except FileNotFoundError as e:
        return _error(str(e))
    runs = list_runs(root)
    for bad in (r for r in runs if r.problem):  # a FIFO for run.json, ...: one line each, the rest listed
        print(f"tpuwatch: {bad.path.name}: {bad.problem}", file=sys.stderr)
    runs = [r for r in runs if not r.problem]
    if not runs:
        print(f"no runs under {rundir.runs_root()}; start one with `tpuwatch run SCRIPT`")
        return 0
    # A terminal (or an explicit $COLUMNS) gets rows that never wrap; a pipe gets everything.
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() or os.environ.get("COLUMNS") else None
    print(render_run_list(runs, width))
    return 0


# --- alerts, Prometheus, TensorBoard (docs/alerts.md, docs/prometheus.md, docs/tensorboard.md) ----


def _add_outlet_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--notify", action="append", default=[], metavar="CMD",
                   help="run shell command CMD on every new warning or critical finding, a stall, a crash and the "
                        "end of the run: the event as JSON on its stdin, TPUWATCH_EVENT_KIND/RULE/SEVERITY/RUN/"
                        "STATUS/MESSAGE in its environment (repeatable; killed after TPUWATCH_NOTIFY_TIMEOUT_S, "
                        "default 10 s; docs/alerts.md)")
    p.add_argument("--notify-min-severity", choices=("info", "warning", "critical"), default="warning",
                   help="the least severe finding --notify sends (default warning); stalls, crashes and the end "
                        "of the run are always sent")
    p.add_argument("--metrics", default="", metavar="HOST:PORT",
                   help="serve the run's numbers on http://HOST:PORT/metrics for Prometheus, from this process "
                        "(HOST defaults to 127.0.0.1: give 127.0.0.1:PORT or just PORT; docs/prometheus.md)")
    p.add_argument("--tensorboard", type=Path, metavar="LOGDIR",
                   help="also write step time, input wait, each replica's loss and memory as TensorBoard scalars "
                        "into LOGDIR/tpuwatch-<run-id> as the run goes (needs the tensorboard package; "
                        "docs/tensorboard.md)")


class _Outlets:
    """What the options above ask for: checked before the script starts, fed by a relay (its own
    thread, tailing the recording) while the run is watched, closed after the view."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns
        self.relay: Relay | None = None
        self.alerts: Alerts | None = None
        self.metrics: MetricsServer | None = None
        self.tensorboard: TensorBoardExport | None = None
        self._quiet = False  # the dashboard has the terminal: say things after it closes
        self._held: list[str] = []

    def open(self, run_id: str | None = None) -> str:
        """Checks the options (for the run ``run_id`` when it exists already); binds --metrics.
        Returns what is wrong with them ("" when nothing is)."""
        if self.ns.tensorboard is not None:
            from tpuwatch.console import tensorboard_export

            if problem := tensorboard_export.problem(self.ns.tensorboard, run_id):
                return problem
        if self.ns.metrics:
            from tpuwatch.console.metrics_server import MetricsServer

            value = self.ns.metrics
            try:
                self.metrics = MetricsServer.open(f"127.0.0.1:{value}" if value.isdigit() else value)
            except ValueError as e:
                return str(e)
        return ""

    def start(self, run_dir: Path, is_alive: Callable[[], bool], *, quiet: bool) -> None:
        from tpuwatch.console.relay import Outlet, Relay, relay_source

        self._quiet = quiet
        outlets: list[Outlet] = []
        if self.ns.notify:
            from tpuwatch.console.alerts import Alerts

            self.alerts = Alerts(self.ns.notify, min_severity=self.ns.notify_min_severity, report=self._report,
                                 run_dir=str(run_dir))
            outlets.append(self.alerts)
        if self.ns.tensorboard is not None:
            from tpuwatch.console import tensorboard_export
            from tpuwatch.monitor.group import worker_dirs

            self.tensorboard = tensorboard_export.TensorBoardExport(
                self.ns.tensorboard, run_dir.name, per_worker=worker_dirs(run_dir) is not None)
            _say(f"TensorBoard scalars into {self.tensorboard.folder}")
            outlets.append(self.tensorboard)
        if self.metrics is not None:
            _say(f"Prometheus metrics on {self.metrics.url}")
            outlets.append(self.metrics.metrics)
        if outlets:
            self.relay = Relay(relay_source(run_dir), is_alive, outlets).start()

    def _report(self, line: str) -> None:
        if self._quiet:
            self._held.append(line)
        else:
            _say(line)

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
            if self.relay.error is not None:
                self._held.append(f"--notify/--metrics/--tensorboard stopped early: {self.relay.error!r}")
            self._held.extend(self.relay.errors)
        self._quiet = False
        for line in self._held:
            _say(line)
        self._held.clear()
        if self.alerts is not None:
            _say(self.alerts.summary())
        if self.metrics is not None:
            self.metrics.close()


if __name__ == "__main__":
    sys.exit(main())

"""Starting a training script under the agent, and stopping it.

The child runs in its own session (``start_new_session=True``) with stdout/stderr going to
``output.log`` in the run directory through a pipe drained by the output pump (its own process,
``output_pump``: the script never waits on the run directory's disk), never to a pipe the viewer
owns: if the viewer dies, a pipe would kill training with SIGPIPE. The launcher
records the end of the run (``run.json`` and, when the agent could not, an ``exit`` record).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tpuwatch import address, protocol, rundir, settings
from tpuwatch.control import output_pump
from tpuwatch.control.run_stop import record_stop_request
from tpuwatch.monitor.recording import last_exit
from tpuwatch.monitor.runs import Process, ended_state

PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


class LaunchError(Exception):
    """Bad input: the message is one line naming what is wrong and what to do."""


@dataclass
class Launch:
    run_dir: Path
    run_id: str
    proc: subprocess.Popen
    started: float
    pump: subprocess.Popen | None = None  # the output pump (None: the script writes output.log itself)

    @property
    def pid(self) -> int:
        return self.proc.pid

    #: ``rundir.process_identity`` of the child, as recorded in run.json.
    identity: str | None = None

    def alive(self) -> bool:
        """Our own child: its exit status, which the kernel keeps for us until we collect it (so
        its pid cannot be reused before), is the verdict; every other viewer asks
        :class:`tpuwatch.monitor.runs.Process`."""
        return self.proc.poll() is None

    @property
    def process(self) -> Process:
        """The child as :mod:`tpuwatch.monitor.runs` names it: what signals go through."""
        return Process(pid=self.proc.pid, pgid=self.proc.pid, identity=self.identity)


def _did_you_mean(path: Path) -> str:
    """``"; did you mean train.py?"`` for a typo'd script path: the closest .py file in its directory."""
    import difflib

    folder = path.parent
    try:
        names = sorted(p.name for p in folder.iterdir() if p.suffix == ".py" and p.is_file())
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
    return f"; did you mean {folder / close[0] if str(folder) != '.' else close[0]}?" if close else ""


def check_script(script: str, module: bool = False) -> None:
    if module:
        return
    path = Path(script)
    if not path.exists():
        raise LaunchError(f"script not found: {script}{_did_you_mean(path)} (give the path of a Python training script)")
    if path.is_dir():
        raise LaunchError(f"{script} is a directory, not a Python file (give the training script inside it)")
    if path.suffix not in (".py", ".pyw", ""):
        raise LaunchError(f"{script} is not a Python file (expected a .py training script)")
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise LaunchError(f"cannot read {script}: {e.strerror}") from None
    if b"\0" in head:
        raise LaunchError(f"{script} is not a Python file (it is binary)")


def check_python(python: str) -> str:
    """Returns the interpreter path; raises LaunchError if it cannot run TensorFlow scripts."""
    exe = shutil.which(python) if os.sep not in python else python
    if not exe or not os.access(exe, os.X_OK):
        raise LaunchError(f"--python {python}: no such executable interpreter")
    # Not realpath: every venv's python links to the same base binary, with other packages.
    if os.path.abspath(exe) == os.path.abspath(sys.executable):
        found = importlib.util.find_spec("tensorflow") is not None
    else:
        probe = subprocess.run(
            [exe, "-c", "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('tensorflow') else 3)"],
            capture_output=True, timeout=60,
        )
        found = probe.returncode == 0
    if not found:
        raise LaunchError(
            f"TensorFlow is not importable in {exe}; install it with `pip install 'tpuwatch[tf]'` "
            "(or tensorflow-tpu on a TPU VM), or pass --python with an interpreter that has it"
        )
    return exe


# Run by the training interpreter, where the child will run: finds the module as `python -m`
# would (the working directory first), importing only its parent packages.
_FIND_MODULE = """
import importlib.util, sys
name = sys.argv[1]
try:
    found = importlib.util.find_spec(name) is not None
except ModuleNotFoundError as e:
    found = not (e.name and (name == e.name or name.startswith(e.name + ".")))
except BaseException:
    found = True  # its package fails to import: the run records that error like any other
sys.exit(0 if found else 3)
"""


def check_module(module: str, exe: str, env: dict[str, str] | None = None) -> None:
    """Raises LaunchError when ``exe`` cannot find ``module`` (``-m``): before the run exists, not
    as a "crashed" run with a traceback."""
    probe_env = dict(os.environ if env is None else env)
    probe_env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, probe_env.get("PYTHONPATH", "")) if p)
    try:
        probe = subprocess.run([exe, "-c", _FIND_MODULE, module], capture_output=True, env=probe_env, timeout=120)
    except subprocess.TimeoutExpired:
        return  # its packages import slowly (or hang): the run itself will show what happens
    if probe.returncode == 3:
        raise LaunchError(f"no module named {module!r} for {exe} (run from {os.getcwd()}); check the name, "
                          "or run from the directory that holds its package, or add that to PYTHONPATH")


def start(
    script: str,
    args: list[str],
    *,
    module: bool = False,
    run_dir: Path | None = None,
    python: str | None = None,
    listen: str = "",
    sample_hz: float | None = None,
    env: dict[str, str] | None = None,
    clock: Callable[[], float] = time.time,
    run_id: str | None = None,
    extra_meta: dict[str, object] | None = None,
) -> Launch:
    """Validates the input, creates the run directory and starts the agent with the script.

    ``run_id`` defaults to the directory's name; ``extra_meta`` goes into run.json (a worker of
    a group names its group and index there)."""
    check_script(script, module)
    exe = check_python(python or sys.executable)
    if module:
        check_module(script, exe, env)
    try:
        address.check_listen(listen)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    run_id = run_id or (run_dir.name if run_dir else rundir.new_run_id(script, clock))
    # Absolute from here on: the script may chdir, and the agent gets this path.
    run_dir = Path(os.path.abspath(run_dir or rundir.runs_root() / run_id))
    try:
        rundir.create(run_dir, run_id, new=True)
        rundir.socket_path(run_dir)
    except rundir.RunDirError as e:
        raise LaunchError(f"run directory: {e.strerror}") from None
    except OSError as e:
        raise LaunchError(f"run directory {run_dir} is not writable ({e.strerror}); "
                          "set TPUWATCH_HOME or pass --run-dir") from None
    child_env = dict(os.environ if env is None else env)
    child_env[settings.RUN_DIR.name] = str(run_dir)
    child_env[settings.RUN_ID.name] = run_id
    child_env["PYTHONUNBUFFERED"] = "1"  # the script's prints reach output.log as they happen
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, child_env.get("PYTHONPATH", "")) if p)
    child_env[settings.PACKAGE_PATH.name] = PACKAGE_PARENT  # the agent takes it off again (plain python's path)
    if listen:
        child_env[settings.LISTEN.name] = listen
    if sample_hz:
        child_env[settings.SAMPLE_HZ.name] = str(sample_hz)
    cmd = [exe, "-m", "tpuwatch.agent"] + (["-m", script] if module else [script]) + list(args)
    started = clock()
    meta = {
        "run_id": run_id,
        "script": script,
        "argv": protocol.clip_argv([script, *args]),
        "python": exe,
        "cwd": os.getcwd(),
        "host": rundir.hostname(),
        "started": started,
        "launcher_pid": os.getpid(),
        "state": "running",
        **(extra_meta or {}),
    }
    rundir.write_meta(run_dir, meta)
    out, pump = _start_output(run_dir)
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=child_env, start_new_session=True)
    except OSError as e:
        raise LaunchError(f"cannot start {exe}: {e.strerror}") from None
    finally:
        os.close(out)  # the pump sees the end of the pipe once the script (and its children) closed it
    # Not yet waited for, so the pid is still the child's (a zombie at worst): its identity is.
    identity = rundir.process_identity(proc.pid)
    rundir.update_meta(run_dir, child_pid=proc.pid, pgid=proc.pid, child_identity=identity)
    return Launch(run_dir=run_dir, run_id=run_id, proc=proc, started=started, identity=identity, pump=pump)


def _start_output(run_dir: Path) -> tuple[int, subprocess.Popen | None]:
    """The script's stdout and stderr: the writing end of a pipe to the output pump, which appends
    to output.log (tpuwatch/control/output_pump.py: the script never waits on the run directory's
    disk); output.log itself if the pump cannot start. Returns that descriptor and the pump."""
    try:
        log = rundir.create_exclusive(run_dir / rundir.OUTPUT, os.O_WRONLY | os.O_APPEND)
    except OSError as e:
        raise LaunchError(f"cannot create {run_dir / rundir.OUTPUT} ({e.strerror}); give a new run directory") from None
    try:
        r, w = os.pipe()
    except OSError:
        return log, None
    output_pump.widen_pipe(w)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH", "")) if p)
    try:
        # Its own session: no terminal signal and no stop of the training's process group reaches it.
        pump = subprocess.Popen([sys.executable, "-m", "tpuwatch.control.output_pump", str(run_dir)],
                                stdin=r, stdout=log, stderr=subprocess.DEVNULL, env=env, start_new_session=True,
                                cwd="/")  # `-m` puts its working directory on sys.path: not the user's
    except OSError:
        os.close(w)
        return log, None
    finally:
        os.close(r)
    os.close(log)
    return w, pump


#: How long the end of a run waits at most for the output pump to write what the script left in
#: the pipe (a slow disk with a full buffer); after that the pump finishes on its own.
OUTPUT_DRAIN_S = 15.0
#: ... and how long output.log must stay the same size for the pump to count as caught up when a
#: child of the script keeps the pipe open (the pump then lives as long as that child).
OUTPUT_QUIET_S = 0.5


def wait_for_output(launch: Launch, timeout: float = OUTPUT_DRAIN_S, quiet_s: float = OUTPUT_QUIET_S) -> None:
    """Waits until the script's output is in output.log: the pump has read the pipe to its end, or
    output.log has stopped growing (a process the script left behind holds the pipe)."""
    pump = launch.pump
    if pump is None:
        return
    path = launch.run_dir / rundir.OUTPUT
    start = last_change = time.monotonic()
    size = -1
    while pump.poll() is None:
        now = time.monotonic()
        try:
            new = os.stat(path).st_size
        except OSError:
            new = -1
        if new != size:
            size, last_change = new, now
        if now - start >= timeout or now - last_change >= quiet_s:
            return
        time.sleep(0.05)


def exit_code_of(returncode: int) -> int:
    """Shell convention: 128+N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def finish(launch: Launch, clock: Callable[[], float] = time.time) -> int:
    """Waits for the child; records the end of the run. Returns the shell exit code."""
    returncode = launch.proc.wait()
    wait_for_output(launch)
    code = exit_code_of(returncode)
    sig = -returncode if returncode < 0 else None
    # The run is over: the disk reserve is for exactly these last records (on a full disk they
    # would fail, leaving run.json "running").
    rundir.release_reserve(launch.run_dir)
    recorded_exit = last_exit(launch.run_dir / rundir.EVENTS)
    recorded = recorded_exit.exit_code if recorded_exit else None
    if recorded != code:
        name = signal.Signals(sig).name if sig else ""
        reason = f"killed by {name}" if sig else "the agent did not record an exit (the process ended abruptly)"
        if recorded is not None:
            # Killed (or exited otherwise) after the agent recorded its exit: the process's real
            # end is the one every view (ls, report, run.json, our exit code) must show.
            reason = f"{reason if sig else f'exited with {code}'} after the agent recorded exit code {recorded}"
        events = launch.run_dir / rundir.EVENTS
        # A process killed mid-write can leave a cut last line: the record must start a line.
        cut = _ends_mid_line(events)
        try:
            with os.fdopen(rundir.open_append(events), "ab") as f:
                f.write((b"\n" if cut else b"") + protocol.encode(
                    protocol.Exit(t=clock(), exit_code=code, signal=sig, source="launcher", reason=reason)))
        except OSError:
            pass  # a full disk even now: run.json below still says how it ended
    _teardown_stacks(launch.run_dir, clock)
    try:
        stop_requested = bool(rundir.read_meta(launch.run_dir).get("stop_requested"))
        rundir.update_meta(launch.run_dir, state=ended_state(code, stop_requested), exit_code=code, ended=clock())
    except OSError:
        pass  # never turn the script's exit code into ours
    return code


def _teardown_stacks(run_dir: Path, clock: Callable[[], float]) -> None:
    """The agent opens ``teardown-stacks.txt`` before the interpreter's teardown (nothing can be
    opened once it hangs); it stays empty unless the teardown outlasted its bound less a second.
    Empty: removed. Written: one warning in the recording says so."""
    path = run_dir / rundir.TEARDOWN_STACKS
    try:
        written = path.stat().st_size > 0
        if not written:
            path.unlink()
            return
        with os.fdopen(rundir.open_append(run_dir / rundir.EVENTS), "ab") as f:
            f.write(protocol.encode(protocol.Event(
                t=clock(), level="warning", source="launcher",
                message="the interpreter's teardown hung after the script ended; it was cut off at TPUWATCH_TEARDOWN_S "
                        f"with the script's exit code (every thread's stack: {rundir.TEARDOWN_STACKS})")))
    except OSError:
        pass  # no file (the guard was off) or a full disk: the exit code is what matters


def _ends_mid_line(path: Path) -> bool:
    try:
        with rundir.open_regular(path) as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:  # empty or missing
        return False


def stop(
    launch: Launch,
    grace_int_s: float = 15.0,
    grace_term_s: float = 10.0,
    report: Callable[[str], None] = lambda line: None,
) -> int:
    """Stops training: SIGINT to its process group, then SIGTERM, then SIGKILL after grace periods."""
    record_stop_request(launch.run_dir, "the dashboard")
    terminate(launch, grace_int_s, grace_term_s, report)
    return finish(launch)


def terminate(
    launch: Launch,
    grace_int_s: float = 15.0,
    grace_term_s: float = 10.0,
    report: Callable[[str], None] = lambda line: None,
) -> None:
    """Signals the child's process group until it is gone (SIGINT, SIGTERM, SIGKILL); records nothing."""
    for sig, grace in ((signal.SIGINT, grace_int_s), (signal.SIGTERM, grace_term_s), (signal.SIGKILL, 10.0)):
        if not launch.alive():
            break
        report(f"sending {sig.name} to the training process group; waiting up to {grace:.0f} s")
        if not launch.process.signal(sig):
            break
        try:
            launch.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue

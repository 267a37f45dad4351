"""Stop from `tpuwatch attach` signals only a process that the run directory's owner started as
that run. The attack: another local user writes a run directory whose run.json names *your*
process (its pid and process group, no identity) beside a valid hello line; you attach to it and
choose Stop. Nothing may be sent: the run directory and run.json must be yours, run.json must
carry the identity of the process it names, and the process group must be the one that process
leads or belongs to.

The attacker is a real second local user (``useradd``; files written through ``runuser``) where
the test runs as root; the victim is a real process of ours that records every signal it gets.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tpuwatch import cli, protocol, rundir
from tpuwatch.commands import dashboard
from tpuwatch.control import run_stop
from tpuwatch.protocol import Hello

pytestmark = pytest.mark.usefixtures("sigint_default")

ATTACKER = "tpuwatch-attacker"

# Records each signal it gets (SIGINT and SIGTERM would otherwise end it), then waits.
VICTIM = """
import os, signal, sys, time
log = sys.argv[1]
def note(sig, frame):
    with open(log, "a") as f:
        f.write(signal.Signals(sig).name + "\\n")
signal.signal(signal.SIGINT, note)
signal.signal(signal.SIGTERM, note)
open(log + ".ready", "w").close()
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    time.sleep(0.05)
"""


@pytest.fixture
def victim(tmp_path):
    """A process of ours in a session of its own (its pid is its process group)."""
    log = tmp_path / "signals.log"
    proc = subprocess.Popen([sys.executable, "-c", VICTIM, str(log)], start_new_session=True)
    deadline = time.monotonic() + 30
    while not Path(str(log) + ".ready").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    try:
        yield proc, log
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def attacker() -> str:
    """A real second local user (root only: useradd)."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip("a second local user needs root, useradd and runuser")
    if subprocess.run(["id", "-u", ATTACKER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", ATTACKER], capture_output=True)
    return ATTACKER


@pytest.fixture
def shared_dir():
    """A sticky, world-writable directory (like /tmp) where the attacker can create a run directory."""
    path = Path(tempfile.mkdtemp(prefix="tpuwatch-shared-"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _hello_line() -> bytes:
    return protocol.encode(Hello(protocol_version=protocol.PROTOCOL_VERSION, agent_version="0.1.0", run_id="trap",
                                 t=time.time(), pid=1, host=rundir.hostname(), worker="w", python_version="3.11",
                                 tf_version="2.21.0", keras_version="3", script="train.py", argv=()))


def _meta(pid: int, pgid: int | None, **extra) -> dict:
    meta = {"run_id": "trap", "script": "train.py", "child_pid": pid, "started": time.time() - 5,
            "host": rundir.hostname(), "state": "running", **extra}
    if pgid is not None:
        meta["pgid"] = pgid
    return meta


def _write_as(user: str, run_dir: Path, meta: dict) -> None:
    for name, data in ((rundir.META, json.dumps(meta).encode()), (rundir.EVENTS, _hello_line())):
        subprocess.run(["runuser", "-u", user, "--", "sh", "-c", 'mkdir -p "$1" && cat > "$1/$2"', "sh",
                        str(run_dir), name], input=data, check=True, capture_output=True)


def _attach_and_stop(run_dir: Path, monkeypatch, capsys) -> tuple[int, str]:
    """`tpuwatch attach RUN`, q, then "Stop training" (the dashboard's answer)."""
    monkeypatch.setattr(dashboard, "show", lambda run_dir, live, **kw: "stop")
    monkeypatch.setattr(cli.sys.stdout, "isatty", lambda: True)
    code = cli.main(["attach", str(run_dir)])
    return code, capsys.readouterr().err


def _no_signal(proc: subprocess.Popen, log: Path) -> None:
    time.sleep(0.3)
    assert proc.poll() is None, "the victim died"
    assert not log.exists(), f"the victim got {log.read_text().split()}"


@pytest.mark.parametrize("group", ["pgid=pid", "pgid of another process"])
def test_another_users_run_directory_naming_my_process_is_never_signalled(tmp_path, victim, attacker, shared_dir,
                                                                          monkeypatch, capsys, group):
    proc, log = victim
    run_dir = shared_dir / "trap"
    _write_as(attacker, run_dir, _meta(os.getpid() if group != "pgid=pid" else proc.pid, proc.pid))
    code, err = _attach_and_stop(run_dir, monkeypatch, capsys)
    assert code == 1, err
    assert "cannot stop the run" in err and "belongs to another user" in err, err
    assert "sending SIGINT" not in err
    _no_signal(proc, log)


def test_a_run_json_chowned_to_another_uid_is_not_stopped(tmp_path, victim, monkeypatch, capsys):
    """The ownership check itself, where no second user can be made: run.json of another uid."""
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    proc, log = victim
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    (run_dir / rundir.META).write_text(json.dumps(_meta(proc.pid, proc.pid,
                                                        child_identity=rundir.process_identity(proc.pid))))
    (run_dir / rundir.EVENTS).write_bytes(_hello_line())
    os.chown(run_dir / rundir.META, 54321, 54321)
    with pytest.raises(run_stop.StopError, match="belongs to another user"):
        run_stop.stop_runs([run_dir], by="test", grace_int_s=1, grace_term_s=1)
    _no_signal(proc, log)


@pytest.mark.parametrize("how", ["no identity", "pgid is not its group"])
def test_my_own_run_json_must_identify_the_process_and_its_group(tmp_path, victim, monkeypatch, capsys, how):
    proc, log = victim
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    if how == "no identity":
        meta = _meta(proc.pid, proc.pid)
        words = "no identity"
    else:  # ourselves, rightly identified, but a process group that is the victim's
        meta = _meta(os.getpid(), proc.pid, child_identity=rundir.process_identity(os.getpid()))
        words = "process group"
    (run_dir / rundir.META).write_text(json.dumps(meta))
    (run_dir / rundir.EVENTS).write_bytes(_hello_line())
    code, err = _attach_and_stop(run_dir, monkeypatch, capsys)
    assert code == 1 and "cannot stop the run" in err and words in err, err
    _no_signal(proc, log)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_stack_dumps_sigusr1_fallback_never_goes_to_another_users_choice(tmp_path, victim, attacker,
                                                                              shared_dir):
    """The stack dump's fallback (SIGUSR1, whose default action ends a process) goes by the same
    rule as a stop: the attacker's run directory names our process, with our identity even."""
    from tpuwatch.control.stack_request import StackRequest

    proc, log = victim
    run_dir = shared_dir / "trap"
    _write_as(attacker, run_dir, _meta(proc.pid, proc.pid, child_identity=rundir.process_identity(proc.pid)))
    request = StackRequest("c1", run_dir=run_dir, pid=proc.pid, fallback_after_s=0.0)
    view = request.update([], [])
    assert view.status == "failed" and "belongs to another user" in view.note, view
    _no_signal(proc, log)


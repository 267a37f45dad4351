"""A shared ``$TPUWATCH_HOME`` must not let another local user take over a
run. Tested with a real second user (``useradd``; needs root, as in CI): it pre-creates the home
or ``runs/`` writable by everyone, or plants links where tpuwatch writes a run's files.

The victim is this test's user (root). What must hold: every command refuses such a home in one
line (exit 2) and creates nothing in it; and no file tpuwatch creates or appends to (token,
events.jsonl, output.log, run.json) is written through a link, so nothing of the victim's
becomes readable (its token in the attacker's file) or appendable (the attacker's link to the
victim's private file)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tpuwatch import protocol, rundir
from tpuwatch.monitor.recording import append

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hard_edges import one_line_error, tpuwatch, write_script  # noqa: E402

from tpuwatch_testing import child_env  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("useradd")
                                or not shutil.which("setpriv"),
                                reason="needs root and useradd/setpriv to create a second local user")


class Attacker:
    def __init__(self, name: str) -> None:
        self.name = name
        import pwd

        entry = pwd.getpwnam(name)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid

    def run(self, *cmd: str) -> None:
        subprocess.run(["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", *cmd],
                       check=True, timeout=30)


@pytest.fixture(scope="module")
def attacker():
    name = f"tpwx{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                   capture_output=True, timeout=60)
    try:
        yield Attacker(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=60)


@pytest.fixture
def shared(attacker):
    """A directory both users can reach (/tmp, like the issue's /tmp/shared)."""
    base = Path(tempfile.mkdtemp(prefix="tpuwatch-shared-", dir="/tmp"))
    base.chmod(0o1777)  # sticky and open to all, like /tmp
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def script(tmp_path):
    return write_script(tmp_path / "train.py", """
        print("training")
    """)


@pytest.mark.tf
@pytest.mark.parametrize("command", [["ls"], ["attach"], ["report"], ["run", "--headless"]])
def test_a_home_pre_created_by_another_user_is_refused(attacker, shared, script, command):
    home = shared / "shared"
    attacker.run("mkdir", "-m", "777", str(home), str(home / "runs"))
    args = [*command, str(script)] if command[0] == "run" else command
    line = one_line_error(tpuwatch(*args, env={"TPUWATCH_HOME": str(home)}, timeout=120),
                          str(home), f"owned by uid {attacker.uid}", "set TPUWATCH_HOME")
    assert "another user" in line
    assert list((home / "runs").iterdir()) == []  # nothing of the victim's was created there


@pytest.mark.tf
@pytest.mark.parametrize("command", [["ls"], ["run", "--headless"]])
def test_a_runs_dir_of_another_user_in_my_home_is_refused(attacker, shared, script, command):
    home = shared / "home"
    home.mkdir(mode=0o755)
    attacker_runs = shared / "theirs"
    attacker.run("mkdir", "-m", "777", str(attacker_runs))
    (home / "runs").symlink_to(attacker_runs)  # or made when the home was open: the owner decides
    args = [*command, str(script)] if command[0] == "run" else command
    one_line_error(tpuwatch(*args, env={"TPUWATCH_HOME": str(home)}, timeout=120),
                   "the runs directory", f"owned by uid {attacker.uid}")
    assert list(attacker_runs.iterdir()) == []


@pytest.mark.tf
def test_my_own_runs_dir_writable_by_others_is_refused(shared, script):
    home = shared / "mine"
    (home / "runs").mkdir(parents=True)
    (home / "runs").chmod(0o777)
    one_line_error(tpuwatch("run", "--headless", str(script), env={"TPUWATCH_HOME": str(home)}),
                   "writable by others (mode 0777)", f"chmod go-w {home / 'runs'}")
    assert list((home / "runs").iterdir()) == []


@pytest.mark.tf
def test_a_private_home_still_works(shared, script):
    home = shared / "private"
    proc = tpuwatch("run", "--headless", str(script), env={"TPUWATCH_HOME": str(home)})
    assert proc.returncode == 0, proc.stderr
    assert "training" in proc.stdout
    assert tpuwatch("ls", env={"TPUWATCH_HOME": str(home)}).returncode == 0


def test_no_file_of_a_run_is_written_through_a_planted_link(attacker, shared):
    """The run directory as the attacker left it (a world-writable one the victim was made to
    use): links to the victim's private file, and to a file of the attacker's own."""
    victim = shared / "victim-secret"
    victim.write_text("PRIVATE\n")
    victim.chmod(0o600)
    run_dir = shared / "run"
    run_dir.mkdir(mode=0o777)
    run_dir.chmod(0o777)
    stolen = run_dir / "stolen"
    attacker.run("touch", str(stolen))
    attacker.run("chmod", "666", str(stolen))
    attacker.run("ln", "-s", str(stolen), str(run_dir / rundir.TOKEN))
    for name in (rundir.EVENTS, rundir.OUTPUT, f".{rundir.META}.{os.getpid()}.{_thread_id()}.tmp"):
        attacker.run("ln", "-s", str(victim), str(run_dir / name))

    # The token: written to a new file, never into the attacker's.
    token = rundir.write_token(run_dir)
    assert stolen.read_text() == "" and (run_dir / rundir.TOKEN).read_text().strip() == token
    assert not (run_dir / rundir.TOKEN).is_symlink()
    # run.json: its temporary file is a new one, never the planted link's target.
    rundir.write_meta(run_dir, {"run_id": "x"})
    assert rundir.read_meta(run_dir) == {"run_id": "x"}
    # events.jsonl (the agent, a viewer's findings, the launcher's exit record) and output.log.
    with pytest.raises(OSError):
        rundir.open_append(run_dir / rundir.EVENTS)
    with pytest.raises(OSError):
        append(run_dir / rundir.EVENTS, [protocol.Event(t=1.0, level="info", source="x", message="appended")])
    with pytest.raises(FileExistsError):
        rundir.create_exclusive(run_dir / rundir.OUTPUT)
    assert victim.read_text() == "PRIVATE\n"


@pytest.mark.tf
def test_the_agent_refuses_an_events_link(attacker, shared, run_agent, tmp_path):
    """The agent itself, started on a run directory holding a link for its recording."""
    victim = shared / "victim-secret"
    victim.write_text("PRIVATE\n")
    victim.chmod(0o600)
    script = write_script(tmp_path / "s.py", "print('x')\n")
    run_dir = shared / "agent-run"
    run_dir.mkdir(mode=0o700)
    os.symlink(victim, run_dir / rundir.EVENTS)
    rundir.write_meta(run_dir, {"run_id": "r1"})  # as its launcher leaves it: the agent's own run
    env = child_env(TPUWATCH_RUN_ID="r1")
    proc = subprocess.run([sys.executable, "-m", "tpuwatch.agent", "--run-dir", str(run_dir), str(script)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert victim.read_text() == "PRIVATE\n", proc.stderr
    one_line_error(proc, "events.jsonl is a symbolic link", "never writes through one")


def _thread_id() -> int:
    import threading

    return threading.get_ident()


@pytest.mark.tf
@pytest.mark.parametrize("command", ["report", "attach", "replay"])
def test_another_users_run_is_one_line_not_a_traceback(attacker, shared, tmp_path, command):
    """A run directory of another user's (0700) gave a PermissionError
    traceback. Root reads everything, so the viewer runs without its DAC override capabilities
    (as any other user would)."""
    script = write_script(tmp_path / "s.py", "print('x')\n")
    home = shared / "theirs-home"
    assert tpuwatch("run", "--headless", str(script), env={"TPUWATCH_HOME": str(home)}).returncode == 0
    (run_dir,) = (home / "runs").iterdir()
    subprocess.run(["chown", "-R", f"{attacker.uid}:{attacker.gid}", str(run_dir)], check=True, timeout=30)
    proc = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-m",
                           "tpuwatch", command, str(run_dir)], capture_output=True, text=True, timeout=60,
                          env=child_env(TPUWATCH_HOME=str(tmp_path / "mine")))
    one_line_error(proc, "permission denied", str(run_dir))


def test_doctor_fails_a_shared_home(attacker, shared):
    home = shared / "doctor-home"
    attacker.run("mkdir", "-m", "777", str(home))
    from tpuwatch.console import doctor

    os.environ["TPUWATCH_HOME"] = str(home)  # the autouse fixture restores it
    check = doctor.rundir_check()
    assert check.status == "fail" and f"owned by uid {attacker.uid}" in check.detail, check


@pytest.mark.tf
def test_a_run_dir_in_a_directory_others_can_write_without_sticky_bit_is_refused(attacker, shared, script):
    """There anyone could rename the new run directory away and put their own in its place."""
    open_dir = shared / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    for run_dir in (open_dir / "r", open_dir / "new" / "r"):  # also where tpuwatch would make the parent
        one_line_error(tpuwatch("run", "--headless", "--run-dir", str(run_dir), str(script)),
                       f"{open_dir} is writable by others (mode 0777, no sticky bit)", "--run-dir")
    assert list(open_dir.iterdir()) == []
    # /tmp-like (sticky): others cannot rename what is ours there.
    open_dir.chmod(0o1777)
    proc = tpuwatch("run", "--headless", "--run-dir", str(open_dir / "r"), str(script))
    assert proc.returncode == 0, proc.stderr
    # A directory of another user's: its owner can rename anything in it.
    theirs = shared / "their-dir"
    attacker.run("mkdir", "-m", "755", str(theirs))
    subprocess.run(["chmod", "1777", str(theirs)], check=True)  # even open to us: still theirs
    one_line_error(tpuwatch("run", "--headless", "--run-dir", str(theirs / "r"), str(script)),
                   f"{theirs} is owned by uid {attacker.uid}")
    # The home itself, likewise: in a directory of theirs, it could be renamed away.
    for command in (["ls"], ["run", "--headless", str(script)]):
        one_line_error(tpuwatch(*command, env={"TPUWATCH_HOME": str(theirs / "home")}),
                       f"{theirs} is owned by uid {attacker.uid}", "TPUWATCH_HOME")

"""The hard edges an attack found: a full disk, fork(), slow and hostile TCP clients,
shared socket paths, --listen, paths a script's chdir moves, foreign run directories, file modes,
ending states and command floods. Real subprocesses, real sockets (127.0.0.1 / Unix), a real
tmpfs for the full disk."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hard_edges import (
    SCRIPTS,
    WaitingAgent,
    attach_line,
    connect_unix,
    exits,
    meta,
    one_line_error,
    results,
    tmpfs,
    tpuwatch,
    umount,
    wait_for,
    write_script,
)

from tpuwatch import protocol
from tpuwatch.agent import transport
from tpuwatch.control.client import AgentClient, new_command
from tpuwatch.protocol import Event, Exit, Hello
from tpuwatch_testing import child_env, read_messages

# --- 1. a full disk ------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 5 MB tmpfs, unmounted afterwards. Mounting needs root (CI containers run as root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "disk"
    tmpfs(mnt, "5m")
    yield mnt
    umount(mnt)


@pytest.mark.tf
def test_a_full_disk_never_fails_the_script(tmp_path, small_disk):
    """The script fills the disk under its run directory, prints 2.4 MB and steps 600 times on it,
    frees the space and steps on: it must finish (exit 0) with everything it could not write
    counted, the headless viewer must say so while it happens, and every view must agree it
    finished. Before: the script's own print raised ENOSPC (exit 1), the launcher crashed."""
    home = small_disk / "home"
    marker = tmp_path / "marker"
    proc = tpuwatch("run", "--headless", str(SCRIPTS / "fill_disk.py"), str(small_disk / "filler"), str(marker),
                    env={"TPUWATCH_HOME": str(home)})
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert marker.read_text() == "survived 620\n"
    assert "is full: the script's output and the recording are being dropped" in proc.stderr
    assert "the disk has space again" in proc.stderr
    (run_dir,) = (home / "runs").iterdir()
    assert meta(run_dir)["state"] == "finished" and meta(run_dir)["exit_code"] == 0
    messages = read_messages(run_dir / "events.jsonl")
    notes = [m.message for m in messages if isinstance(m, Event) and m.source == "disk-full"]
    assert notes, "no note of what the full disk cost"
    # The agent notes the recording's losses, the output pump the output's.
    assert any("recorded message(s)" in n for n in notes) and any("bytes of the script's output" in n for n in notes)
    assert [m.exit_code for m in messages if isinstance(m, Exit)] == [0]
    assert "step 619 after the disk has space again" in (run_dir / "output.log").read_text()
    ls = tpuwatch("ls", env={"TPUWATCH_HOME": str(home)})
    assert "finished" in ls.stdout and "lost" not in ls.stdout, ls.stdout
    report = tpuwatch("report", str(run_dir), env={"TPUWATCH_HOME": str(home)})
    assert "the disk was full" in report.stdout and "complete" not in report.stdout.split("recording", 1)[1][:80]


# --- 2. fork ---------------------------------------------------------------------------------------

FORKING_SCRIPT = """
import json, multiprocessing, os, signal, sys, time
run_dir = os.environ["TPUWATCH_RUN_DIR"]
sock = json.load(open(os.path.join(run_dir, "run.json")))["socket"]

def square(x):
    return x * x

pid = os.fork()
if pid == 0:
    sys.exit(3)  # a child that ends normally, through the interpreter (and the agent's end)
_, status = os.waitpid(pid, 0)
pool = multiprocessing.get_context("fork").Pool(2)
assert pool.map(square, range(8)) == [x * x for x in range(8)]
pool.close(); pool.join()
pid = os.fork()
if pid == 0:  # a child ended by SIGTERM (as Pool.terminate does): the parent must not take it as its own
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
    os._exit(0)
assert os.waitpid(pid, 0)[1] == signal.SIGTERM
time.sleep(2.0)  # longer than the agent's SIGTERM watcher waits
print("child", os.waitstatus_to_exitcode(status), "socket-still-there", os.path.exists(sock), flush=True)
"""


@pytest.mark.tf
def test_a_forked_child_leaves_the_agent_to_the_parent(tmp_path):
    """A child made by fork() that exits normally, a multiprocessing fork pool, and a child ended by
    SIGTERM must neither remove the parent's socket, nor write a second exit record, nor end the
    parent. Before: the child ran the agent's
    end (socket deleted, "exit 3" recorded while training went on)."""
    script = write_script(tmp_path / "forks.py", FORKING_SCRIPT)
    proc = tpuwatch("run", "--headless", str(script))
    assert proc.returncode == 0, proc.stderr
    assert "child 3 socket-still-there True" in proc.stdout, proc.stdout + proc.stderr
    (run_dir,) = (Path(os.environ["TPUWATCH_HOME"]) / "runs").iterdir()
    assert [(e.exit_code, e.source) for e in exits(run_dir)] == [(0, "agent")]
    hellos = [m for m in read_messages(run_dir / "events.jsonl") if isinstance(m, Hello)]
    assert len(hellos) == 1


# --- 4. slow unauthenticated TCP clients ------------------------------------------------------------


@pytest.mark.tf
def test_slow_tcp_clients_never_lock_out_control(tmp_path):
    """40 TCP clients that dribble a byte every 0.3 s and never finish their first line: local
    commands (and `tpuwatch checkpoint`) still work, a TCP viewer with the token still attaches,
    every dribbler is closed by the total handshake deadline, and the refusals are recorded.
    Before: 16 dribblers took every viewer slot (local ones too) for as long as they liked."""
    agent = WaitingAgent(tmp_path, tmp_path / "run", "--listen", "127.0.0.1:0")
    dribblers: list[socket.socket] = []
    stop = threading.Event()
    try:
        agent.wait_ready()
        host, port = meta(agent.run_dir)["tcp"].rsplit(":", 1)
        for _ in range(40):
            dribblers.append(socket.create_connection((host, int(port)), timeout=10))

        def dribble() -> None:
            while not stop.is_set():
                for s in dribblers:
                    try:
                        s.send(b" ")
                    except OSError:
                        pass
                stop.wait(0.3)

        threading.Thread(target=dribble, daemon=True).start()
        time.sleep(0.5)  # let the agent accept them all
        # Local control: a command gets its result.
        client = AgentClient.for_run(agent.run_dir)
        cmd = new_command("no-such-action")
        client.send(cmd)
        wait_for(lambda: any(r.id == cmd.id for r in results(agent.run_dir)), 30, "a local command's result")
        client.close()
        cli = tpuwatch("checkpoint", str(agent.run_dir), "--timeout", "30")
        assert "Traceback" not in cli.stderr, cli.stderr
        assert "tpuwatch: checkpoint" in cli.stdout + cli.stderr
        # A TCP viewer with the token attaches and streams.
        token = (agent.run_dir / "token").read_text().strip()
        viewer = AgentClient(tcp=(host, int(port)), token=token)
        first = next(viewer.stream(offset=0, idle_timeout_s=20))
        assert isinstance(protocol.Decoder().decode(first), Hello)
        # Every dribbler is closed within the handshake deadline (plus slack), bytes or not.
        def all_closed() -> bool:
            for s in dribblers:
                s.settimeout(0.01)
                try:
                    if s.recv(4096, socket.MSG_PEEK) == b"":
                        continue
                    data = s.recv(65536)  # the refusal line: read it, then look for EOF
                    if data == b"":
                        continue
                except socket.timeout:
                    return False
                except OSError:
                    continue
                return False
            return True
        wait_for(all_closed, transport.HANDSHAKE_TIMEOUT_S + 20, "the dribblers being closed", interval=0.5)
        stop.set()
        assert agent.finish() == 0
        refusals = [m.message for m in read_messages(agent.run_dir / "events.jsonl")
                    if isinstance(m, Event) and m.source == "transport" and "refused viewer" in m.message]
        assert any("no attach line within" in r for r in refusals), refusals
    finally:
        stop.set()
        for s in dribblers:
            s.close()
        agent.kill()


# --- 5. socket paths --------------------------------------------------------------------------------


def _long_dir(base: Path, tag: str) -> Path:
    d = base / tag / ("x" * 60) / ("y" * 40) / "run"
    assert len(str(d / "agent.sock")) > 100
    return d


@pytest.mark.tf
def test_long_run_directories_never_share_a_socket(tmp_path):
    """Two run directories both named `run`, too long for AF_UNIX: each gets its own socket, and a
    command sent to A is answered by A. Before: both used /tmp/tpuwatch-<uid>/run.sock, and
    `tpuwatch checkpoint A` reached B."""
    a = WaitingAgent(tmp_path, _long_dir(tmp_path, "a"), name="a")
    a.wait_ready()
    b = WaitingAgent(tmp_path, _long_dir(tmp_path, "b"), name="b")
    try:
        b.wait_ready()
        sock_a, sock_b = meta(a.run_dir)["socket"], meta(b.run_dir)["socket"]
        assert sock_a != sock_b and Path(sock_a).exists() and Path(sock_b).exists()
        base = Path(sock_a).parent
        assert stat.S_IMODE(base.stat().st_mode) == 0o700
        cmd = new_command("no-such-action")
        AgentClient.for_run(a.run_dir).send(cmd)
        wait_for(lambda: any(r.id == cmd.id for r in results(a.run_dir)), 30, "A's result")
        assert not any(r.id == cmd.id for r in results(b.run_dir))
        assert a.finish() == 0 and b.finish() == 0
        assert not Path(sock_a).exists() and not Path(sock_b).exists()
    finally:
        a.kill()
        b.kill()


@pytest.mark.tf
def test_a_socket_directory_of_ours_open_to_others_is_refused(tmp_path):
    """The fallback directory for long run directories, ours but readable by others: refused with
    one line saying how to fix it (another user could reach the socket). Before: accepted."""
    tmpdir = tmp_path / "tmp"
    base = tmpdir / f"tpuwatch-{os.getuid()}"
    base.mkdir(parents=True)
    os.chmod(base, 0o755)
    script = write_script(tmp_path / "never.py", f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    proc = tpuwatch("run", "--headless", "--run-dir", str(_long_dir(tmp_path, "c")), str(script),
                    env={"TMPDIR": str(tmpdir)})
    one_line_error(proc, str(base), "not a private directory", f"chmod 700 {base}")
    assert not (tmp_path / "ran").exists()


@pytest.mark.tf
def test_a_socket_directory_squatted_by_another_user_is_worked_around(tmp_path):
    """Another user made $TMPDIR/tpuwatch-<uid> first (in a sticky /tmp the victim cannot remove
    it): a long run directory's socket goes to $TPUWATCH_HOME/sockets/ instead, private, and the
    run works. Before: every run with a run directory over ~100 bytes was refused, told to
    "remove it"."""
    if os.geteuid() != 0:
        pytest.skip("making a directory owned by another user needs root")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    tmpdir.chmod(0o1777)
    base = tmpdir / f"tpuwatch-{os.getuid()}"
    base.mkdir(mode=0o700)
    os.chown(base, 65534, 65534)
    import shutil
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="tpw-"))  # short enough for a socket path under it, wherever tmp_path is
    agent = WaitingAgent(tmp_path, _long_dir(tmp_path, "c"), env={"TMPDIR": str(tmpdir), "TPUWATCH_HOME": str(home)})
    try:
        agent.wait_ready()
        sock = Path(meta(agent.run_dir)["socket"])
        assert sock.parent == home / "sockets" and stat.S_IMODE(sock.parent.stat().st_mode) == 0o700, sock
        cmd = new_command("no-such-action")
        AgentClient.for_run(agent.run_dir).send(cmd)
        wait_for(lambda: any(r.id == cmd.id for r in results(agent.run_dir)), 30, "the result")
        assert agent.finish() == 0
    finally:
        agent.kill()
        shutil.rmtree(home, ignore_errors=True)
    assert not list(base.iterdir())


# --- 6. --listen ------------------------------------------------------------------------------------


@pytest.mark.parametrize("listen,words", [
    ("garbage", ["expected HOST:PORT"]),
    ("127.0.0.1:99999", ["out of range"]),
    ("no-such-host.invalid:7711", ["cannot resolve"]),
    ("BUSY", ["cannot listen there"]),
])
@pytest.mark.tf
def test_listen_is_checked_before_the_script_starts(tmp_path, listen, words):
    """A --listen that cannot work is one line and exit 2 before anything runs. Before: the run
    started, and 99999 raised OverflowError inside the agent."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    if listen == "BUSY":
        listen = "127.0.0.1:%d" % busy.getsockname()[1]
    script = write_script(tmp_path / "never.py", f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    try:
        proc = tpuwatch("run", "--headless", "--listen", listen, str(script))
    finally:
        busy.close()
    one_line_error(proc, *words)
    assert not (tmp_path / "ran").exists()
    assert not (Path(os.environ["TPUWATCH_HOME"]) / "runs").exists() or not any(
        (Path(os.environ["TPUWATCH_HOME"]) / "runs").iterdir())


@pytest.mark.tf
def test_local_control_survives_a_tcp_port_in_use(tmp_path):
    """The agent itself (the port taken between the launcher's check and its bind): the Unix
    socket still works and the failure is said on stderr and in the recording. Before: no socket
    at all, and no word outside the recording."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    agent = WaitingAgent(tmp_path, tmp_path / "run", "--listen", "127.0.0.1:%d" % busy.getsockname()[1])
    try:
        agent.wait_ready()
        cmd = new_command("no-such-action")
        AgentClient.for_run(agent.run_dir).send(cmd)
        wait_for(lambda: any(r.id == cmd.id for r in results(agent.run_dir)), 30, "the local result")
        assert agent.finish() == 0
        assert "cannot listen on 127.0.0.1" in agent.output()
        assert any(isinstance(m, Event) and "cannot listen on" in m.message
                   for m in read_messages(agent.run_dir / "events.jsonl"))
    finally:
        busy.close()
        agent.kill()


# --- 7. paths resolved at launch --------------------------------------------------------------------

CHDIR_SCRIPT = """
import os, sys, time
import tensorflow  # the agent's commands are installed with TensorFlow
os.makedirs("elsewhere", exist_ok=True)
os.chdir("elsewhere")
ready, stop = sys.argv[1], sys.argv[2]
open(ready, "w").write("x")
deadline = time.monotonic() + 120
while not os.path.exists(stop) and time.monotonic() < deadline:
    time.sleep(0.05)
"""


@pytest.mark.tf
@pytest.mark.parametrize("relative", ["run-dir", "home"])
def test_relative_paths_survive_a_chdir(tmp_path, relative):
    """A relative --run-dir or TPUWATCH_HOME and a script that chdirs: a stack dump lands in the
    run directory (not under the new cwd), and the socket is removed at the end. Before: files
    went under the new cwd while the message named the run dir, and a stale socket was left."""
    work = tmp_path / "work"
    work.mkdir()
    write_script(work / "chdir.py", CHDIR_SCRIPT)
    ready, stop = tmp_path / "ready", tmp_path / "stop"
    args = ["run", "--headless"]
    env = {}
    if relative == "run-dir":
        args += ["--run-dir", "rel-run"]
        run_dir = work / "rel-run"
    else:
        env["TPUWATCH_HOME"] = "rel-home"
    launcher = subprocess.Popen([sys.executable, "-m", "tpuwatch", *args, "chdir.py", str(ready), str(stop)],
                                cwd=work, env=child_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        wait_for(ready.exists, 120, "the script")
        if relative == "home":
            (run_dir,) = (work / "rel-home" / "runs").iterdir()
        sock = meta(run_dir)["socket"]
        assert os.path.isabs(sock)
        cmd = new_command("stack_dump")
        AgentClient.for_run(run_dir).send(cmd)
        result = wait_for(lambda: next((r for r in results(run_dir) if r.id == cmd.id), None), 30, "the dump")
        assert result.ok, result.message
        assert Path(result.details["path"]).parent == run_dir.resolve() / "stacks"
        assert Path(result.details["path"]).exists()
        assert not (work / "elsewhere" / "rel-run").exists() and not (work / "elsewhere" / "rel-home").exists()
        stop.write_text("")
        _, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 0, err
        assert not Path(sock).exists()
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


# --- 8. foreign run directories ---------------------------------------------------------------------


@pytest.mark.tf
def test_a_non_empty_foreign_run_dir_is_refused(tmp_path):
    """--run-dir at a directory with someone's files, or at an old run: one line, exit 2, the
    directory untouched (mode and contents). Before: chmodded to 0700 and appended to."""
    script = write_script(tmp_path / "s.py", "print('hi')\n")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chmod(theirs, 0o755)
    (theirs / "precious.txt").write_text("keep")
    one_line_error(tpuwatch("run", "--headless", "--run-dir", str(theirs), str(script)), "not empty")
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o755
    assert sorted(p.name for p in theirs.iterdir()) == ["precious.txt"]
    # An old run's directory: refused too (the old recording is not appended to).
    old = tmp_path / "old"
    assert tpuwatch("run", "--headless", "--run-dir", str(old), str(script)).returncode == 0
    before = (old / "events.jsonl").read_bytes()
    one_line_error(tpuwatch("run", "--headless", "--run-dir", str(old), str(script)), "not empty")
    assert (old / "events.jsonl").read_bytes() == before
    # The agent on its own, too.
    agent = subprocess.run([sys.executable, "-m", "tpuwatch.agent", "--run-dir", str(theirs), str(script)],
                           capture_output=True, text=True, env=child_env(), timeout=120)
    assert agent.returncode == 2 and "not empty" in agent.stderr, agent.stderr
    # An empty directory is fine (and becomes private).
    empty = tmp_path / "empty"
    empty.mkdir()
    assert tpuwatch("run", "--headless", "--run-dir", str(empty), str(script)).returncode == 0
    assert stat.S_IMODE(empty.stat().st_mode) == 0o700


# --- 9. file modes ----------------------------------------------------------------------------------


@pytest.mark.tf
def test_everything_tpuwatch_creates_is_private(tmp_path):
    """A new TPUWATCH_HOME: home, runs/, the run directory 0700; output.log, run.json,
    events.jsonl, token 0600. A --listen on every address warns. Before: home and runs 0755,
    output.log and run.json 0644."""
    home = tmp_path / "new" / "home"
    script = write_script(tmp_path / "s.py", "print('hi')\n")
    proc = tpuwatch("run", "--headless", "--listen", "0.0.0.0:0", str(script), env={"TPUWATCH_HOME": str(home)})
    assert proc.returncode == 0, proc.stderr
    assert "warning: --listen 0.0.0.0:0 accepts viewers from every network" in proc.stderr
    (run_dir,) = (home / "runs").iterdir()
    for d in (tmp_path / "new", home, home / "runs", run_dir):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    for name in ("output.log", "run.json", "events.jsonl", "token"):
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o600, name
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".")) == []  # no reserve, no temp


def test_checkpoint_and_profile_directories_are_private(tmp_path):
    """The directories a checkpoint or profile is written into are created 0700."""
    from tpuwatch.agent import destinations

    target = tmp_path / "ckpt" / "a" / "b"
    destinations.ensure_writable(target)
    for d in (tmp_path / "ckpt", tmp_path / "ckpt" / "a", target):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


# --- 11. ending states ------------------------------------------------------------------------------

IGNORES_SIGINT = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
open(sys.argv[1], "w").write("x")
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    time.sleep(0.05)
"""


@pytest.mark.tf
def test_an_ignored_sigint_is_escalated(tmp_path):
    """Ctrl-C on `tpuwatch run --headless` whose script ignores SIGINT: after the grace period
    SIGTERM follows by itself, said on stderr, and the exit code is 143. Before: "sending SIGINT"
    and nothing else."""
    script = write_script(tmp_path / "ignore.py", IGNORES_SIGINT)
    ready = tmp_path / "ready"
    launcher = subprocess.Popen([sys.executable, "-m", "tpuwatch", "run", "--headless", str(script), str(ready)],
                                env=child_env(TPUWATCH_STOP_GRACE_S="2"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        wait_for(ready.exists, 120, "the script")
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert "sending SIGINT" in err
    assert "still running 2 s after SIGINT" in err and "sending SIGTERM" in err, err
    assert launcher.returncode == 143, err


@pytest.mark.tf
def test_a_sigterm_without_a_viewer_is_recorded(tmp_path):
    """SIGTERM to an agent nobody supervises (the viewer detached): the agent records the exit
    itself and the process still dies by SIGTERM. Before: no exit record, `ls` said lost."""
    agent = WaitingAgent(tmp_path, tmp_path / "run")
    try:
        agent.wait_ready()
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(timeout=60) == -signal.SIGTERM
    finally:
        agent.kill()
    assert [(e.exit_code, e.signal, e.source) for e in exits(agent.run_dir)] == [(143, 15, "agent")]
    info = tpuwatch("report", str(agent.run_dir), "--format", "json")
    run = json.loads(info.stdout)["run"]
    assert run["status"] == "crashed" and run["exit_code"] == 143


BLOCKED_IN_NATIVE_CODE = """
import hashlib, sys
open(sys.argv[1], "w").write("x")
hashlib.pbkdf2_hmac("sha256", b"pw", b"salt", 2_000_000_000)  # minutes in C, no bytecode boundary
"""


@pytest.mark.tf
def test_a_sigterm_ends_a_process_stuck_in_native_code(tmp_path):
    """The recording handler must not delay SIGTERM while the main thread is in native code: the
    watcher thread records the exit and ends the process with SIGTERM."""
    script = write_script(tmp_path / "blocked.py", BLOCKED_IN_NATIVE_CODE)
    ready = tmp_path / "ready"
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "tpuwatch.agent", "--run-dir", str(run_dir), str(script),
                             str(ready)], env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(ready.exists, 120, "the script")
        time.sleep(0.3)  # inside the C call
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [(e.exit_code, e.signal) for e in exits(run_dir)] == [(143, 15)]


KILLED_AFTER_ITS_EXIT = """
import atexit, os, signal
atexit.register(lambda: os.kill(os.getpid(), signal.SIGKILL))
print("done")
"""


@pytest.mark.tf
def test_one_ending_everywhere(tmp_path):
    """Killed after the agent recorded exit 0 (an atexit handler): ls, report, run.json and the
    exit code all say 137. Before: ls "finished 0", run.json and the exit code 137."""
    script = write_script(tmp_path / "late.py", KILLED_AFTER_ITS_EXIT)
    proc = tpuwatch("run", "--headless", str(script))
    assert proc.returncode == 137, proc.stderr
    (run_dir,) = (Path(os.environ["TPUWATCH_HOME"]) / "runs").iterdir()
    assert meta(run_dir)["state"] == "crashed" and meta(run_dir)["exit_code"] == 137
    ls = tpuwatch("ls").stdout.splitlines()[1].split()
    assert ls[1] == "crashed" and "137" in ls, ls
    run = json.loads(tpuwatch("report", str(run_dir), "--format", "json").stdout)["run"]
    assert run["status"] == "crashed" and run["exit_code"] == 137


@pytest.mark.tf
def test_a_hard_crash_says_what_may_be_missing(tmp_path):
    """A process killed hard: the report's recording line says the last flush may be missing.
    Before: "recording complete"."""
    script = write_script(tmp_path / "crash.py", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert tpuwatch("run", "--headless", str(script)).returncode == 137
    (run_dir,) = (Path(os.environ["TPUWATCH_HOME"]) / "runs").iterdir()
    text = tpuwatch("report", str(run_dir)).stdout
    line = next(x for x in text.splitlines() if x.strip().startswith("recording"))
    assert "may be missing" in line and "complete" not in line, line


# --- 12. command floods -----------------------------------------------------------------------------


@pytest.mark.tf
def test_a_command_flood_is_rate_limited(tmp_path):
    """A viewer (valid, local) sends 3,000 commands at once: a bounded number reach the agent
    (each would cost a result line and training-thread work), the rest are skipped, counted and
    said, and the viewer is disconnected. Before: 3,000 results."""
    agent = WaitingAgent(tmp_path, tmp_path / "run")
    try:
        agent.wait_ready()
        conn = connect_unix(meta(agent.run_dir)["socket"])
        conn.sendall(attach_line())
        flood = b"".join(protocol.encode(new_command("no-such-action")) for _ in range(3000))
        try:
            conn.sendall(flood)
        except OSError:
            pass  # disconnected for it: that is the point

        def closed() -> bool:
            try:
                return conn.recv(65536) == b""
            except ConnectionResetError:  # closed with our unread lines still queued
                return True
        wait_for(closed, 30, "the agent closing the flooding viewer")
        conn.close()
        assert agent.finish() == 0
    finally:
        agent.kill()
    n = len(results(agent.run_dir))
    assert 0 < n < 300, n
    said = [m.message for m in read_messages(agent.run_dir / "events.jsonl")
            if isinstance(m, Event) and "commands faster than" in m.message]
    assert any("disconnected after skipping" in m for m in said), said


@pytest.mark.tf
def test_reconnecting_does_not_reset_the_command_rate_limit(tmp_path):
    """A valid local viewer sends 15 commands a connection (under one viewer's burst) over 100
    connections in a row: the limit is the agent's, not the connection's, so a bounded number
    reach the agent. Before: every one of the 1,500 did (1,000 stack dumps in 1.4 s)."""
    agent = WaitingAgent(tmp_path, tmp_path / "run")
    try:
        agent.wait_ready()
        batch = b"".join(protocol.encode(new_command("no-such-action")) for _ in range(15))
        for _ in range(100):
            conn = wait_for(lambda: _connect_or_none(meta(agent.run_dir)["socket"]), 30, "a connection")
            try:
                conn.sendall(attach_line() + batch)
            except OSError:
                pass
            finally:
                conn.close()
        assert agent.finish() == 0
    finally:
        agent.kill()
    n = len(results(agent.run_dir))
    assert 0 < n < 300, n


def _connect_or_none(path: str) -> socket.socket | None:
    try:
        return connect_unix(path)
    except BlockingIOError:  # the listen backlog is full: the agent is still closing the last ones
        return None


@pytest.mark.tf
@pytest.mark.parametrize("where", ["the run directory", "a parent"])
def test_a_run_dir_through_another_users_link_is_refused(tmp_path, where):
    """`--run-dir` through a symbolic link another user owns (pointing at a directory of ours):
    they could re-point it mid-run (the headless viewer crashed, the agent wrote its teardown
    stacks into their directory). Refused in one line before the script starts. Before: accepted."""
    if os.geteuid() != 0:
        pytest.skip("a link owned by another user needs root (lchown)")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = shared / "link"
    link.symlink_to(mine)
    os.lchown(link, 65534, 65534)
    run_dir = link if where == "the run directory" else link / "run"
    script = write_script(tmp_path / "never.py", f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    proc = tpuwatch("run", "--headless", "--run-dir", str(run_dir), str(script))
    one_line_error(proc, str(link), "symbolic link", "uid 65534")
    assert not (tmp_path / "ran").exists() and not list(mine.iterdir())

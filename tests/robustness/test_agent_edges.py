"""The hard edges inside the training process: a slow run-directory disk, a script
that closed or replaced stderr, a script that reuses the agent's descriptors,
``os.setsid``, re-exec, ``sys.path``, a huge argv and a patched ``time.time``.
Real subprocesses; a real ext4 file system on a loop device, frozen with ``fsfreeze``, for the
disk that does not answer (root only, as in CI)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hard_edges import meta, tpuwatch, umount, wait_for, write_script

from tpuwatch.control import output_pump
from tpuwatch.protocol import Event, ExceptionRaised, Exit, Hello, Step
from tpuwatch_testing import child_env, read_messages

# Every test here starts a real agent (TensorFlow), directly or through a fixture.
pytestmark = [pytest.mark.tf, pytest.mark.usefixtures("sigint_default")]  # SIGINT reaches the scripts

# --- 6. a slow run-directory disk ------------------------------------------------------------------


@pytest.fixture
def ext4_disk(tmp_path):
    """A 64 MB ext4 file system on a loop device (root only), unfrozen and unmounted afterwards;
    a watchdog unfreezes it after 120 s whatever happens to the test (a frozen disk hangs every
    writer, this test's cleanup included)."""
    if os.geteuid() != 0:
        pytest.skip("a loop device and fsfreeze need root")
    image = tmp_path / "disk.img"
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True, capture_output=True)
    watchdog = subprocess.Popen(["sh", "-c", f"sleep 120; fsfreeze -u '{mnt}'"], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield mnt
    subprocess.run(["fsfreeze", "-u", str(mnt)], capture_output=True)
    watchdog.kill()
    watchdog.wait()
    umount(mnt)


PRINTING_SCRIPT = """
import os, sys, time
ready, go, printed, end = sys.argv[1:5]
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.02)
for i in range({lines}):
    print(f"out {{i}} " + "x" * 200)
    sys.stderr.write(f"err {{i}}\\n")
open(printed, "w").close()
while not os.path.exists(end):
    time.sleep(0.02)
print("the last line")
os._exit(3)
"""


def test_a_disk_that_does_not_answer_never_holds_the_script(tmp_path, ext4_disk):
    """The run directory's file system is frozen (every write to it waits) while the script prints
    12 MB, stdout and stderr interleaved: the script must get through its prints while the disk
    is frozen; once it thaws, output.log must hold the end of the output in order (the last line
    before ``os._exit`` included), and the recording must say the output was late and what was
    dropped. Before: the script's first print waited for the disk (it never got through)."""
    lines = 50_000  # ~12 MB: more than the pump holds (8 MiB) and the pipe (1 MiB) together
    script = write_script(tmp_path / "printing.py", PRINTING_SCRIPT.format(lines=lines))
    ready, go, printed, end = (tmp_path / n for n in ("ready", "go", "printed", "end"))
    run_dir = ext4_disk / "run"
    proc = subprocess.Popen([sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(run_dir),
                             str(script), str(ready), str(go), str(printed), str(end)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(), start_new_session=True)
    try:
        wait_for(ready.exists, 120, "the script to start")
        subprocess.run(["fsfreeze", "-f", str(ext4_disk)], check=True)
        frozen_at = time.monotonic()
        go.touch()
        deadline = time.monotonic() + 60
        while not printed.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        got_through = printed.exists()
        time.sleep(max(0.0, output_pump.LATE_S + 0.5 - (time.monotonic() - frozen_at)))
    finally:
        subprocess.run(["fsfreeze", "-u", str(ext4_disk)], capture_output=True)
    assert got_through, "the script's print waited for the run directory's disk"
    end.touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    log = (run_dir / "output.log").read_text().splitlines()
    assert log[-1] == "the last line"
    tail = log[-2 * 1000 - 1:-1]  # the last 1000 lines of each stream, interleaved as written
    first = int(tail[0].split()[1])
    assert tail == [line for i in range(first, lines) for line in (f"out {i} " + "x" * 200, f"err {i}")]
    messages = read_messages(run_dir / "events.jsonl")
    said = [m.message for m in messages if isinstance(m, Event)]
    assert any(output_pump.LATE_MESSAGE in m for m in said), said
    (note,) = [m for m in said if "dropped" in m and "bytes of the script's output" in m]
    dropped = int(note.split("dropped ")[1].split(" bytes")[0].replace(",", ""))
    assert dropped == sum(len(f"out {i} " + "x" * 200) + len(f"err {i}") + 2 for i in range(lines)) \
        + len("the last line\n") - os.path.getsize(run_dir / "output.log")
    assert [m.exit_code for m in messages if isinstance(m, Exit)] == [3]
    # The headless viewer says both as they come.
    said_live = err.decode()
    assert f"tpuwatch: {output_pump.LATE_MESSAGE}" in said_live and f"tpuwatch: {note}" in said_live, said_live


# --- 9. a script that closed or replaced stderr -------------------------------------------------

CLOSED_STDERR = {
    "fd 2 closed": "import os\nos.close(2)\nraise ValueError('after closing fd 2')\n",
    "sys.stderr None": "import sys\nsys.stderr = None\nraise ValueError('stderr is None')\n",
    "sys.stderr without flush": (
        "import sys\n"
        "class Writer:\n"
        "    def write(self, text):\n"
        "        sys.__stdout__.write(text)\n"
        "sys.stderr = Writer()\n"
        "raise ValueError('no flush')\n"),
}


@pytest.mark.parametrize("case", sorted(CLOSED_STDERR))
def test_a_crash_without_a_usable_stderr_is_recorded(tmp_path, case):
    """The script made stderr unusable, then raised: its exception and the agent's exit are
    recorded, the socket is removed, and tpuwatch adds no traceback of its own (the traceback is
    written where Python would write it: nowhere, or to the replacement). Before: tpuwatch's own
    AttributeError/OSError escaped, the run "ended abruptly" and agent.sock stayed."""
    script = write_script(tmp_path / "crash.py", CLOSED_STDERR[case])
    run_dir = tmp_path / "run"
    proc = tpuwatch("run", "--headless", "--run-dir", str(run_dir), str(script))
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=child_env())
    assert proc.returncode == plain.returncode, proc.stderr  # 1, or 120 when Python cannot flush at exit
    messages = read_messages(run_dir / "events.jsonl")
    (raised,) = [m for m in messages if isinstance(m, ExceptionRaised)]
    assert raised.type == "ValueError"
    assert [(m.source, m.exit_code) for m in messages if isinstance(m, Exit)] == [("agent", plain.returncode)]
    assert not Path(meta(run_dir)["socket"]).exists()
    output = (run_dir / "output.log").read_text()
    assert "AttributeError" not in output and "OSError" not in output, output
    if case == "sys.stderr without flush":
        assert output.rstrip().endswith("ValueError: no flush"), output
        assert plain.stdout.rstrip().endswith("ValueError: no flush")


@pytest.mark.parametrize("body", [
    "class Odd(Exception):\n    def __str__(self):\n        return 1 / 0\nraise Odd()\n",
    "import sys\ndel sys.excepthook\nraise ValueError('no hook')\n",
], ids=["str() raises", "no sys.excepthook"])
def test_an_exception_that_cannot_be_printed_still_ends_the_run(tmp_path, body):
    """An exception whose str() raises, or a script that deleted sys.excepthook: the exception and
    the agent's exit are still recorded, with Python's exit code (found by a review: tpuwatch's
    own traceback escaped and the run had no exit record)."""
    script = write_script(tmp_path / "odd.py", body)
    run_dir = tmp_path / "run"
    proc = tpuwatch("run", "--headless", "--run-dir", str(run_dir), str(script))
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=child_env())
    assert proc.returncode == plain.returncode == 1, proc.stderr
    messages = read_messages(run_dir / "events.jsonl")
    assert len([m for m in messages if isinstance(m, ExceptionRaised)]) == 1
    assert [(m.source, m.exit_code) for m in messages if isinstance(m, Exit)] == [("agent", 1)]
    assert "tpuwatch/agent" not in (run_dir / "output.log").read_text()


# --- 10. the agent's descriptors --------------------------------------------------------------------

REUSING_SCRIPT = """
import os, sys, time
import tpuwatch

own = sys.argv[1]
events = os.path.join(os.environ["TPUWATCH_RUN_DIR"], "events.jsonl")
mine = [int(n) for n in os.listdir("/proc/self/fd")
        if os.path.realpath(f"/proc/self/fd/{{n}}") == os.path.realpath(events)]
{how}
for i in range(50):
    with tpuwatch.step(examples=8) as s:
        s.loss = 1.0 / (i + 1)
time.sleep(1.0)  # several of the agent's flushes while the descriptor is the script's
f.close()
print("agent descriptors", mine, "mine", fd, "high", all(n >= 100 for n in mine))
"""

REUSE = {
    # The low descriptors a script closes "to tidy up", then reuses: never the agent's.
    "closerange, open": "os.closerange(3, 100)\nf = open(own, 'w')\nfd = f.fileno()",
    # The recording's own descriptor number, closed and taken over (dup2): the agent must notice.
    "dup2 onto the agent's": "f = open(own, 'w')\nfd = mine[0]\nos.dup2(f.fileno(), fd)",
}


@pytest.mark.parametrize("case", sorted(REUSE))
def test_the_agent_never_writes_into_a_reused_descriptor(tmp_path, case):
    """The script closes a descriptor and opens its own file on the same number: nothing of
    tpuwatch's may land in the script's file, and the recording goes on (every step recorded).
    Before: the agent's recording was fd 3, and the steps' JSON lines went into the script's file."""
    body = REUSING_SCRIPT.format(how=REUSE[case].replace("\n", "\n"))
    script = write_script(tmp_path / "reuse.py", body)
    own = tmp_path / "own.txt"
    run_dir = tmp_path / "run"
    proc = tpuwatch("run", "--headless", "--run-dir", str(run_dir), str(script), str(own))
    assert proc.returncode == 0, proc.stderr
    assert own.read_text() == "", own.read_text()[:500]
    output = (run_dir / "output.log").read_text()
    assert "high True" in output, output
    messages = read_messages(run_dir / "events.jsonl")
    assert len([m for m in messages if isinstance(m, Step)]) == 50
    assert [m.exit_code for m in messages if isinstance(m, Exit)] == [0]


# --- 12. re-exec, sys.path, a huge argv, a patched clock ------------------------------------------

def test_a_patched_time_time_leaves_the_run_its_own_clock(tmp_path):
    """The script moves ``time.time`` an hour ahead (as a mock or a simulated clock does): the
    run's times are still the real ones. Before: the exit record was stamped with the script's
    clock and the run lasted "1h00m"."""
    script = write_script(tmp_path / "clock.py", """
        import time
        import tpuwatch
        real = time.time
        time.time = lambda: real() + 3600.0
        for i in range(5):
            with tpuwatch.step(examples=8) as s:
                s.loss = 1.0
        raise SystemExit(0)
        """)
    run_dir = tmp_path / "run"
    before = time.time()
    proc = tpuwatch("run", "--headless", "--run-dir", str(run_dir), str(script))
    after = time.time()
    assert proc.returncode == 0, proc.stderr
    messages = read_messages(run_dir / "events.jsonl")
    assert all(before <= m.t <= after for m in messages if hasattr(m, "t")), \
        [(type(m).__name__, m.t) for m in messages if hasattr(m, "t") and not before <= m.t <= after]
    assert "1h" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("pythonpath", [True, False], ids=["with PYTHONPATH", "without PYTHONPATH"])
def test_sys_path_is_what_python_gives_the_script(tmp_path, pythonpath):
    """``sys.path`` under tpuwatch is plain ``python train.py``'s: a ``secrets.py`` in the working
    directory is not imported in place of the standard module (the script's own directory comes
    first, as in Python). Before: the agent's ``-m`` put the working directory on sys.path."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "secrets.py").write_text("raise SystemExit('the working directory shadowed the standard secrets')\n")
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    script = write_script(scripts / "show_path.py", """
        import json, sys
        import secrets
        print(json.dumps(sys.path))
        """)
    env = child_env()
    if not pythonpath:  # the launcher's own entry for tpuwatch is then the only one: it must go
        env.pop("PYTHONPATH")
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=work, env=env)
    assert plain.returncode == 0, plain.stderr
    run_dir = tmp_path / "run"
    # -P: the tpuwatch command's own sys.path has no working directory (as its console script)
    proc = subprocess.run([sys.executable, "-P", "-m", "tpuwatch", "run", "--headless", "--run-dir", str(run_dir),
                           str(script)], capture_output=True, text=True, timeout=180, cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr
    shown = (run_dir / "output.log").read_text().strip()
    assert shown == plain.stdout.strip()


def test_a_huge_argv_keeps_the_hello(tmp_path):
    """1.6 MB of arguments: the hello record is still written (its argv shortened, saying so)
    and the run has its name. Before: the hello line was over the 1 MiB line limit and dropped."""
    script = write_script(tmp_path / "args.py", """
        import sys
        print(len(sys.argv), sum(map(len, sys.argv[1:])))
        """)
    args = ["a" * 1000] * 1600
    run_dir = tmp_path / "run"
    proc = tpuwatch("run", "--headless", "--run-dir", str(run_dir), str(script), *args)
    assert proc.returncode == 0, proc.stderr
    assert (run_dir / "output.log").read_text().split() == ["1601", str(1600 * 1000)]
    (hello,) = [m for m in read_messages(run_dir / "events.jsonl") if isinstance(m, Hello)]
    assert hello.argv[0] == str(script) and hello.argv[1] == "a" * 1000
    assert "more argument" in hello.argv[-1]
    assert len(json.dumps(hello.argv)) < 100_000


def test_a_script_that_re_execs_itself_keeps_its_run(tmp_path):
    """The script re-executes itself (``os.execv(sys.executable, [sys.executable] + sys.argv)``,
    as restart-on-failure code does): the new image runs under the agent too, in the same run,
    and its steps and exit are recorded. Before: only the first image's hello and the launcher's
    exit were recorded."""
    script = write_script(tmp_path / "reexec.py", """
        import os, sys
        import tpuwatch
        again = len(sys.argv) > 1
        for i in range(3):
            with tpuwatch.step(examples=8) as s:
                s.loss = 1.0
        if not again:
            os.execv(sys.executable, [sys.executable] + sys.argv + ["again"])
        print("second image, argv", sys.argv[1:])
        raise SystemExit(4)
        """)
    run_dir = tmp_path / "run"
    proc = tpuwatch("run", "--headless", "--run-dir", str(run_dir), str(script))
    assert proc.returncode == 4, proc.stderr
    assert (run_dir / "output.log").read_text() == "second image, argv ['again']\n"
    messages = read_messages(run_dir / "events.jsonl")
    assert len([m for m in messages if isinstance(m, Step)]) == 6
    assert [(m.source, m.exit_code) for m in messages if isinstance(m, Exit)] == [("agent", 4)]


# --- 11. os.setsid / os.setpgrp ---------------------------------------------------------------------

SESSION_SCRIPT = """
import os, sys, time
call = sys.argv[2]
result = os.setsid() if call == "setsid" else os.setpgrp()
print(call, result, "group leader", os.getpgrp() == os.getpid(), flush=True)
open(sys.argv[1], "w").close()
time.sleep(60)
"""


@pytest.mark.parametrize("call", ["setsid", "setpgrp"])
def test_setsid_and_setpgrp_work_and_stop_still_reaches_the_script(tmp_path, call):
    """``os.setsid()`` and ``os.setpgrp()`` succeed as under plain python from a script
    (the script already leads its own session, away from the terminal: what they ask for), and a
    Ctrl-C to ``tpuwatch run`` still reaches the script through its process group. Before: each
    raised PermissionError (EPERM: the child is a session leader)."""
    script = write_script(tmp_path / "session.py", SESSION_SCRIPT)
    ready = tmp_path / "ready"
    plain = subprocess.Popen([sys.executable, str(script), str(tmp_path / "plain-ready"), call], stdout=subprocess.PIPE,
                             text=True, env=child_env())
    wait_for((tmp_path / "plain-ready").exists, 60, "plain python's script")
    plain.kill()
    plain_out = plain.communicate()[0]
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(run_dir),
                             str(script), str(ready), call], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env())
    try:
        wait_for(lambda: ready.exists() or proc.poll() is not None, 120, "the script's calls")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: forwarded to the training's process group
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert plain_out == f"{call} None group leader True\n"
    assert (run_dir / "output.log").read_text() == plain_out, err
    assert proc.returncode == 130, err
    assert [m.exit_code for m in read_messages(run_dir / "events.jsonl") if isinstance(m, Exit)] == [130]


KILLED_PUMP_SCRIPT = """
import os, sys, time
ready, killed = sys.argv[1], sys.argv[2]
print("before", flush=True)
open(ready, "w").close()
while not os.path.exists(killed):
    time.sleep(0.02)
for i in range(100):
    print(f"after {i}")
    sys.stderr.write(f"err {i}\\n")
"""


def test_a_killed_output_pump_never_breaks_the_script(tmp_path):
    """The process draining the script's output is killed (SIGKILL: a `kill -9`, the OOM killer):
    the script's next prints must not fail with a broken pipe; its output goes straight to
    output.log from then on, and the recording says so. Before: BrokenPipeError killed training."""
    script = write_script(tmp_path / "pump_killed.py", KILLED_PUMP_SCRIPT)
    ready, killed = tmp_path / "ready", tmp_path / "killed"
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(run_dir),
                             str(script), str(ready), str(killed)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        wait_for(ready.exists, 120, "the script")
        pumps = [int(p) for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).endswith(
            f"tpuwatch.control.output_pump\0{run_dir}\0")]
        assert len(pumps) == 1
        os.kill(pumps[0], signal.SIGKILL)
        wait_for(lambda: _exited(pumps[0]), 30, "the pump's end")
        killed.touch()
        err = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    log = (run_dir / "output.log").read_text()
    assert "after 99\nerr 99\n" in log, log[-500:]
    said = [m.message for m in read_messages(run_dir / "events.jsonl") if isinstance(m, Event)]
    assert any("output pump" in m for m in said), said


SLEEPS = """
import sys, time
time.sleep(60)
"""


@pytest.mark.parametrize("delay_s, workers", [(0.0, None), (0.05, None), (0.0, "2")])
def test_a_ctrl_c_while_the_training_starts_reaches_it(tmp_path, delay_s, workers):
    """Ctrl-C as ``tpuwatch run --headless`` starts the training (its output log made, the
    script started just after): the training gets the SIGINT and tpuwatch says so and exits with
    its code. Before: tpuwatch's own handler was set only after the launch, so a SIGINT in those
    ~0.1 s ended tpuwatch with 130 and nothing said, and the training (its own session) ran on,
    orphaned; a loaded CI box once took so long there that the test above saw it."""
    script = write_script(tmp_path / "sleeps.py", SLEEPS)
    run_dir = tmp_path / "run"
    group = ["--workers", workers] if workers else []
    proc = subprocess.Popen([sys.executable, "-m", "tpuwatch", "run", "--headless", *group, "--run-dir", str(run_dir),
                             str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    pids: list[int] = []
    try:
        first_log = run_dir / "worker-0" / "output.log" if workers else run_dir / "output.log"
        wait_for(lambda: first_log.exists() or proc.poll() is not None, 60, "the run's output log", interval=0.001)
        time.sleep(delay_s)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for d in [run_dir, *sorted(run_dir.glob("worker-*"))]:
            pid = meta(d).get("child_pid")
            if pid:
                pids.append(pid)
        left = [pid for pid in pids if not _exited(pid)]
        for pid in left:  # never leave one behind, whatever the outcome
            os.kill(pid, signal.SIGKILL)
    assert pids, err
    assert left == [], f"training processes still running after tpuwatch ended: {left}; {err}"
    assert "sending SIGINT" in err, err
    # The training's own end: 130 (its KeyboardInterrupt, or killed by SIGINT before Python's
    # handler was set), or 1 where the SIGINT landed in Python's own start-up imports (a
    # KeyboardInterrupt traceback from importlib, exit 1, as under plain python).
    assert proc.returncode in (130, 1), err


def _exited(pid: int) -> bool:
    """Every thread of ``pid`` is past the point where the kernel closes its descriptors: it is
    gone, or a zombie with no other thread left. An empty cmdline alone is not that: the first
    thread to exit gives up the memory that cmdline is read from while another still holds the
    pipe open, and output written then is read by no one."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X") and tasks == [str(pid)]


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read()
    except OSError:
        return ""

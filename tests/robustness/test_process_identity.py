"""A run's recorded pid, reused by an unrelated process after the run's own
died (`kill -9` of the launcher, then of the agent), is not the run. ``ls``, ``attach`` and
stopping the run must neither call it running nor signal it: a process is identified by its pid
*and* the identity recorded at launch (start time after boot, boot id).

The reuse is real: the run is recorded by a real ``tpuwatch run``, its end is cut off as a
``kill -9`` leaves it, and run.json is pointed at a live, unrelated process (its own session,
as the issue's repro had it) that started after the run's child did."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpuwatch import rundir
from tpuwatch.control import run_stop
from tpuwatch.control.stack_request import StackRequest
from tpuwatch.monitor.runs import list_runs, process_of, run_alive
from tpuwatch_testing import child_env

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hard_edges import WAITING_SCRIPT, tpuwatch, wait_for, write_script  # noqa: E402


def _recorded_run(tmp_path: Path) -> Path:
    """A real run (``tpuwatch run``), then made to look killed by SIGKILL: no exit record, no end
    in run.json."""
    script = write_script(tmp_path / "short.py", """
        print("hello from the script")
    """)
    proc = tpuwatch("run", "--headless", str(script))
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = [p for p in rundir.runs_root().iterdir()]
    events = run_dir / rundir.EVENTS
    lines = [line for line in events.read_bytes().splitlines(keepends=True) if b'"kind":"exit"' not in line]
    events.write_bytes(b"".join(lines))
    meta = json.loads((run_dir / rundir.META).read_text())
    for key in ("exit_code", "ended"):
        meta.pop(key, None)
    meta["state"] = "running"
    (run_dir / rundir.META).write_text(json.dumps(meta))
    return run_dir


@pytest.fixture
def stranger():
    """An unrelated live process in a session of its own (what took over the pid)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _reuse(run_dir: Path, pid: int, **extra) -> None:
    meta = json.loads((run_dir / rundir.META).read_text())
    meta.update(child_pid=pid, pgid=pid, **extra)
    (run_dir / rundir.META).write_text(json.dumps(meta))


@pytest.mark.tf
def test_a_launch_records_the_identity_of_its_child(tmp_path):
    run_dir = _recorded_run(tmp_path)
    meta = rundir.read_meta(run_dir)
    boot, _, ticks = meta["child_identity"].partition(":")
    assert boot == Path("/proc/sys/kernel/random/boot_id").read_text().strip() and int(ticks) > 0
    # The live process of the same identity is the run's, while it runs: ourselves, as a stand-in.
    me = dict(meta, child_pid=os.getpid(), pgid=None, child_identity=rundir.process_identity(os.getpid()))
    assert run_alive(me)


@pytest.mark.tf
def test_a_reused_pid_is_neither_running_nor_signalled(tmp_path, stranger):
    run_dir = _recorded_run(tmp_path)
    _reuse(run_dir, stranger.pid)
    assert not run_alive(rundir.read_meta(run_dir))

    # ls: the run is lost, not running.
    (info,) = list_runs()
    assert info.state == "lost", info

    # attach (no argument prefers a running run): into a file it ends at once, failed (lost).
    proc = tpuwatch("attach", timeout=60)
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "RUNNING" not in proc.stdout

    # Stop (what the dashboard's Stop does for an attached run): refused, nothing sent.
    with pytest.raises(run_stop.StopError, match="already ended"):
        run_stop.stop_runs([run_dir], by="test", grace_int_s=1, grace_term_s=1)
    process = process_of(rundir.read_meta(run_dir))
    assert process is not None
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        assert process.signal(sig) is False
    assert not process.group_alive()

    # The stack dump's SIGUSR1 fallback: refused too.
    request = StackRequest("c1", run_dir=run_dir, pid=stranger.pid, fallback_after_s=0.0)
    view = request.update([], [])
    assert view.status == "failed" and "already ended" in view.note, view

    time.sleep(0.2)
    assert stranger.poll() is None, "the unrelated process was signalled"


@pytest.mark.tf
def test_a_run_json_without_identity_is_judged_by_its_start(tmp_path, stranger):
    """run.json written before identities were recorded: a process that started an hour after the
    run did cannot be its child."""
    run_dir = _recorded_run(tmp_path)
    meta = json.loads((run_dir / rundir.META).read_text())
    meta.pop("child_identity")
    meta["started"] = time.time() - 3600
    (run_dir / rundir.META).write_text(json.dumps(meta))
    _reuse(run_dir, stranger.pid)
    assert not run_alive(rundir.read_meta(run_dir))
    assert list_runs()[0].state == "lost"
    # ... while one that started before the run did is still taken for it.
    assert run_alive(dict(rundir.read_meta(run_dir), child_pid=os.getpid(), pgid=None, started=time.time()))


def _set_child_subreaper() -> bool:
    """Orphans of our descendants come to us (so we can reap the killed agent and free its pid)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _start_with_pid(pid: int, tries: int = 50) -> subprocess.Popen | None:
    """An unrelated process (its own session) given exactly ``pid``, through ns_last_pid (root);
    None when the box's other processes keep taking it first."""
    for _ in range(tries):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
        except OSError:
            return None
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/proc/sys/kernel/ns_last_pid"),
                    reason="reusing a given pid needs root and /proc/sys/kernel/ns_last_pid")
@pytest.mark.tf
def test_a_really_reused_pid_after_kill_9(tmp_path):
    """The issue's repro itself: a headless run, `kill -9` of the launcher, then of the agent; the
    kernel then gives the agent's pid to an unrelated process that starts its own session."""
    if not _set_child_subreaper():
        pytest.skip("cannot become a child subreaper (needed to reap the orphaned agent)")
    script = write_script(tmp_path / "wait.py", WAITING_SCRIPT)
    ready, stop = tmp_path / "ready", tmp_path / "stop"
    launcher = subprocess.Popen([sys.executable, "-m", "tpuwatch", "run", "--headless", str(script), str(ready),
                                 str(stop)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=child_env(), start_new_session=True)
    stranger = None
    try:
        wait_for(ready.exists, 120, "the script")
        (run_dir,) = rundir.runs_root().iterdir()
        pid = rundir.read_meta(run_dir)["child_pid"]
        launcher.kill()
        launcher.wait()
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: os.waitpid(pid, os.WNOHANG)[0] == pid, 30, "the orphaned agent reaped")
        stranger = _start_with_pid(pid)
        if stranger is None:
            pytest.skip(f"pid {pid} kept being taken by other processes")
        assert (info := list_runs()[0]).state == "lost", info
        proc = tpuwatch("attach", timeout=60)
        assert proc.returncode == 1 and "RUNNING" not in proc.stdout, (proc.returncode, proc.stdout, proc.stderr)
        with pytest.raises(run_stop.StopError, match="already ended"):
            run_stop.stop_runs([run_dir], by="test", grace_int_s=1, grace_term_s=1)
        process = process_of(rundir.read_meta(run_dir))
        assert process is not None and not process.signal(signal.SIGINT)
        time.sleep(0.2)
        assert stranger.poll() is None, "the unrelated process was signalled"
    finally:
        stop.write_text("")
        for p in (launcher, stranger):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()

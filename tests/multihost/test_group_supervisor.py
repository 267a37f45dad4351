"""The group supervisor over real (plain Python) processes: a dead worker's peers are stopped after
the grace period, with SIGINT then SIGTERM, and every end is recorded."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tpuwatch import rundir
from tpuwatch.control.group_launch import GroupLaunch, Supervisor, free_ports, tf_config
from tpuwatch.control.launcher import Launch

IGNORES_SIGINT = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"


def _group(tmp_path: Path, codes: list[str], grace_s: float) -> GroupLaunch:
    run = tmp_path / "group"
    rundir.create(run)
    names = [f"worker:{i}" for i in range(len(codes))]
    rundir.write_meta(run, {"run_id": "g", "group": True, "started": time.time(), "state": "running",
                            "workers": [{"name": n, "index": i, "dir": f"worker-{i}"} for i, n in enumerate(names)]})
    launches = []
    for i, code in enumerate(codes):
        wdir = rundir.create(run / f"worker-{i}")
        rundir.write_meta(wdir, {"run_id": f"g-{i}", "state": "running"})
        proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rundir.update_meta(wdir, child_pid=proc.pid)
        launches.append(Launch(run_dir=wdir, run_id=f"g-{i}", proc=proc, started=time.time()))
    return GroupLaunch(run_dir=run, run_id="g", workers=launches, names=names, started=time.time(), grace_s=grace_s)


def _exit_records(wdir: Path) -> list[dict]:
    path = wdir / rundir.EVENTS
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_dead_worker_stops_the_hanging_peer_after_the_grace(tmp_path):
    g = _group(tmp_path, [IGNORES_SIGINT, "import time, sys; time.sleep(0.5); sys.exit(3)"], grace_s=0.5)
    said: list[str] = []
    code = Supervisor(g, say=said.append).start().wait(timeout=30)
    assert code == 3  # the first failure, not the peer's SIGTERM (143)
    assert g.ends["worker:1"].exit_code == 3 and not g.ends["worker:1"].stopped
    assert g.ends["worker:0"].exit_code == 128 + 15 and g.ends["worker:0"].stopped  # SIGINT ignored -> SIGTERM
    assert any("worker:1 ended with exit code 3; stopping worker:0 in 0.5 s" in s for s in said), said
    assert any("SIGTERM" in s for s in said)
    meta = rundir.read_meta(g.run_dir)
    assert meta["state"] == "crashed" and meta["exit_code"] == 3
    assert [(w["state"], w["exit_code"], w["stopped"]) for w in meta["workers"]] == [
        ("crashed", 143, True), ("crashed", 3, False)]
    # each worker's recording got the launcher's exit record (the processes wrote none)
    assert _exit_records(g.workers[0].run_dir)[-1]["signal"] == 15
    assert _exit_records(g.workers[1].run_dir)[-1]["exit_code"] == 3


def test_clean_exit_starts_no_countdown(tmp_path):
    g = _group(tmp_path, ["import time; time.sleep(1.5)", "pass"], grace_s=0.1)
    code = Supervisor(g).start().wait(timeout=30)
    assert code == 0
    assert not any(e.stopped for e in g.ends.values())  # worker 0 ran to its end, nobody stopped it
    assert rundir.read_meta(g.run_dir)["state"] == "finished"


def _logs_signals(log: Path, name: str) -> str:
    """A worker that notes each SIGINT (and ignores it) and each SIGTERM (and dies of it) in ``log``."""
    return (
        "import os, signal, time\n"
        "def note(sig, frame):\n"
        f"    with open({str(log)!r}, 'a') as f: f.write({name!r} + ' ' + signal.Signals(sig).name + '\\n')\n"
        "    if sig == signal.SIGTERM:\n"
        "        signal.signal(signal.SIGTERM, signal.SIG_DFL); os.kill(os.getpid(), signal.SIGTERM)\n"
        "signal.signal(signal.SIGINT, note); signal.signal(signal.SIGTERM, note)\n"
        f"open({str(log)!r} + '.' + {name!r}, 'w').close()\n"
        "time.sleep(60)\n"
    )


def test_stop_all_in_parallel(tmp_path):
    log = tmp_path / "signals.log"
    g = _group(tmp_path, [_logs_signals(log, "w0"), _logs_signals(log, "w1")], grace_s=15)
    sup = Supervisor(g).start()
    deadline = time.monotonic() + 30
    while not all(Path(f"{log}.w{i}").exists() for i in range(2)):  # both handlers set
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.02)
    g.stop(grace_int_s=0.5, grace_term_s=2)
    # Both at once, not one after the other: every worker got its SIGINT before any got SIGTERM.
    got = log.read_text().split("\n")[:-1]
    assert sorted(got[:2]) == ["w0 SIGINT", "w1 SIGINT"] and sorted(got[2:]) == ["w0 SIGTERM", "w1 SIGTERM"], got
    assert sup.wait(timeout=10) == 143
    assert all(e.stopped and e.exit_code == 143 for e in g.ends.values())


def test_tf_config_and_ports():
    ports = free_ports(3)
    assert len(set(ports)) == 3
    cfg = json.loads(tf_config(ports, 2))
    assert cfg == {"cluster": {"worker": [f"localhost:{p}" for p in ports]}, "task": {"type": "worker", "index": 2}}

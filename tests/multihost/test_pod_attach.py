"""One viewer over several hosts: agents started separately (each its own `tpuwatch run --headless
--listen`, its own TPUWATCH_HOME, as on the hosts of a pod) with one TPUWATCH_TOKEN in their
environment, and one `tpuwatch attach A B` in a real terminal (tmux) with that token in *its*
environment. Nothing carries the token on a command line."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tpuwatch_testing import ROOT, child_env

pytestmark = pytest.mark.tf

SCRIPT = ROOT / "tests" / "robustness" / "scripts" / "robust_train.py"


def _wait(predicate, timeout: float, what: str, detail=lambda: ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}:\n{detail()}")


def _tcp(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / "run.json").read_text()).get("tcp")
    except (OSError, ValueError):
        return None


def _cmdlines(pid: int) -> list[str]:
    try:
        root = psutil.Process(pid)
        return [" ".join(p.cmdline()) for p in [root, *root.children(recursive=True)]]
    except psutil.NoSuchProcess:
        return []


def test_one_viewer_attaches_to_two_separately_started_agents_sharing_a_token(tmp_path):
    assert shutil.which("tmux"), "tmux is required for this end-to-end test (.ci/run installs it)"
    token = secrets.token_urlsafe(24)
    stop = tmp_path / "stop"
    hosts: list[tuple[subprocess.Popen, Path]] = []
    tmux = ["tmux", "-S", str(tmp_path / "tmux.sock")]
    try:
        for i in range(2):
            home = tmp_path / f"host{i}"
            home.mkdir()
            run_dir = home / "run"
            log = open(tmp_path / f"host{i}.log", "wb")
            proc = subprocess.Popen(
                [sys.executable, "-m", "tpuwatch", "run", "--headless", "--every", "1", "--listen", "127.0.0.1:0",
                 "--run-dir", str(run_dir), str(SCRIPT), "--steps", "100000", "--step-sleep", "0.05",
                 "--stop-file", str(stop), "--ready", str(tmp_path / f"ready{i}")],
                stdout=log, stderr=subprocess.STDOUT, cwd=home, start_new_session=True,
                env=child_env(TPUWATCH_HOME=str(home), TPUWATCH_TOKEN=token))
            log.close()
            hosts.append((proc, run_dir))
        addresses = []
        for i, (_proc, run_dir) in enumerate(hosts):
            output = lambda i=i: (tmp_path / f"host{i}.log").read_text()  # noqa: E731
            addresses.append(_wait(lambda run_dir=run_dir: _tcp(run_dir), 180, f"host {i}'s listener", output))
            # Each agent took the shared token from its environment, not a random one.
            assert (run_dir / "token").read_text().strip() == token
            _wait(lambda i=i: (tmp_path / f"ready{i}").exists(), 180, f"host {i}'s first step", output)
        for proc, _ in hosts:
            assert not [c for c in _cmdlines(proc.pid) if token in c]

        # The viewer's tmux server (and so the pane) inherits TPUWATCH_TOKEN from this environment.
        viewer_env = child_env(TPUWATCH_TOKEN=token, TERM="xterm-256color")
        viewer_env.pop("COLUMNS", None)
        viewer_env.pop("LINES", None)
        status = tmp_path / "viewer.status"
        argv = [sys.executable, "-m", "tpuwatch", "attach", *addresses]
        command = f"cd {shlex.quote(str(ROOT))} && {shlex.join(argv)}; echo $? > {shlex.quote(str(status))}; sleep 60"
        subprocess.run([*tmux, "new-session", "-d", "-s", "viewer", "-x", "160", "-y", "48", command],
                       env=viewer_env, check=True, timeout=30)
        screen = lambda: subprocess.run([*tmux, "capture-pane", "-p", "-t", "viewer"], capture_output=True,  # noqa: E731
                                        text=True, timeout=30).stdout
        _wait(lambda: "2 workers" in screen(), 120, "the merged header", screen)
        names = []
        for _, run_dir in hosts:
            hello = json.loads((run_dir / "events.jsonl").open().readline())
            assert hello["kind"] == "hello"
            names.append(hello["worker"])
        # The Workers panel lists both agents, each with its own step count.
        text = _wait(lambda: (lambda s: s if all(n in s for n in names) else "")(screen()), 60,
                     "both workers in the Workers panel", screen)
        assert "Workers" in text and "refused" not in text and "wrong or missing token" not in text

        stop.touch()
        for proc, _ in hosts:
            assert proc.wait(timeout=180) == 0
        _wait(lambda: "FINISHED" in screen(), 60, "the merged run to finish", screen)
        subprocess.run([*tmux, "send-keys", "-t", "viewer", "q"], check=True, timeout=30)
        assert int(_wait(lambda: status.exists() and status.read_text().strip(), 30, "the viewer to exit", screen)) == 0
        assert token not in screen()
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=30)
        for proc, _ in hosts:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=30)


def test_run_listen_refuses_a_short_shared_token(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    proc = subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", "--listen", "127.0.0.1:0",
                           "--run-dir", str(tmp_path / "run"), str(script)], capture_output=True, text=True,
                          timeout=60, env=child_env(TPUWATCH_TOKEN="abc123"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "TPUWATCH_TOKEN has 6 characters" in proc.stderr
    assert "abc123" not in proc.stderr and not (tmp_path / "run").exists()

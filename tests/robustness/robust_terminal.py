"""A real terminal for end-to-end tests: one private tmux server per test.

``tpuwatch run`` and ``tpuwatch attach`` are started in a tmux pane (a real pty, a real Textual
app), read back with ``capture-pane`` (plain text) and poked with ``send-keys``, signals and
``kill-session`` (which closes the pty: the hang-up of a closed terminal or a lost SSH link).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tpuwatch_testing import ROOT, child_env


def have_tmux() -> bool:
    return shutil.which("tmux") is not None


class Tmux:
    def __init__(self, workdir: Path, width: int = 160, height: int = 48) -> None:
        self.socket = workdir / "tmux.sock"
        self.conf = workdir / "tmux.conf"
        # remain-on-exit: the screen stays readable after the command ends.
        self.conf.write_text(f"set -g remain-on-exit on\nset -g history-limit 5000\n"
                             f"set -g default-size {width}x{height}\n")
        self.width = width
        self.height = height
        self.sessions: list[str] = []

    def _tmux(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run(["tmux", "-S", str(self.socket), "-f", str(self.conf), *args],
                              capture_output=True, text=True, timeout=30)
        if check and proc.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        """Starts ``argv`` in a new session; returns its pid.

        A shell in the pane runs it and writes its exit status to a file (tmux itself cannot be
        relied on for it: it may see the pty close before it reaps the process).
        """
        env = child_env(**(env or {}))
        keep = {k: env[k] for k in ("PYTHONPATH", "TPUWATCH_HOME", "TF_CPP_MIN_LOG_LEVEL", "HOME", "PATH",
                                    "TPUWATCH_VIEWER_TIMEOUT_S") if k in env}
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in keep.items())
        status = self.socket.parent / f"{name}.status"
        # COLUMNS/LINES from the test runner's environment would override the pane's real size.
        command = (f"cd {shlex.quote(str(ROOT))} && env -u COLUMNS -u LINES {assigns} "
                   f"{' '.join(map(shlex.quote, argv))}; "
                   f"echo $? > {shlex.quote(str(status))}")
        self._tmux("new-session", "-d", "-s", name, "-x", str(self.width), "-y", str(self.height), command)
        self.sessions.append(name)
        shell = int(self._tmux("display-message", "-p", "-t", name, "#{pane_pid}").strip())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                children = psutil.Process(shell).children()
            except psutil.NoSuchProcess:
                children = []
            if children:
                return children[0].pid
            time.sleep(0.02)
        raise AssertionError(f"{argv} did not start in tmux")

    def screen(self, name: str) -> str:
        return self._tmux("capture-pane", "-p", "-S", "-", "-t", name)  # with the history

    def wait_for(self, name: str, text: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen(name)
            if text in screen:
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{text!r} did not appear within {timeout} s; screen:\n{screen}")

    def wait_until_gone(self, name: str, text: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen(name)
            if text not in screen:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} still on the screen after {timeout} s:\n{screen}")

    def keys(self, name: str, *keys: str) -> None:
        self._tmux("send-keys", "-t", name, *keys)

    def dead_status(self, name: str, timeout: float = 60.0) -> int:
        """Waits for the command to end; returns its exit status (128+N: killed by signal N)."""
        status = self.socket.parent / f"{name}.status"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                text = status.read_text().strip()
            except FileNotFoundError:
                text = ""
            if text:
                return int(text)
            time.sleep(0.1)
        raise AssertionError(f"the process in {name} did not end within {timeout} s:\n{self.screen(name)}")

    def kill_session(self, name: str) -> None:
        self._tmux("kill-session", "-t", name, check=False)

    def close(self) -> None:
        self._tmux("kill-server", check=False)


def tpuwatch_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "tpuwatch", *args]


def wait_file_int(path: Path, at_least: int, timeout: float = 120.0) -> int:
    """Waits until ``path`` holds an integer >= at_least (the test script's step counter)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = int(path.read_text().strip() or 0)
        except (OSError, ValueError):
            value = -1
        if value >= at_least:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{path} did not reach {at_least} within {timeout} s")


def wait_meta(run_dir: Path, key: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            meta = json.loads((run_dir / "run.json").read_text())
        except (OSError, ValueError):
            meta = {}
        if key in meta:
            return meta[key]
        time.sleep(0.1)
    raise AssertionError(f"run.json in {run_dir} has no {key!r} after {timeout} s")


def wait_gone(pid: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        # A child of ours that ended is a zombie until reaped: that is gone too.
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    return
        except OSError:
            return
        time.sleep(0.1)
    raise AssertionError(f"pid {pid} still running after {timeout} s")

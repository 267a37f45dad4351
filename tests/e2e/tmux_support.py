"""Driving a real tmux from the end-to-end tests (shared by every test in tests/e2e)."""

from __future__ import annotations

import subprocess
import time


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def wait_for(predicate, timeout: float, what: str, screen=lambda: "") -> str:
    """Polls ``screen()`` every 0.5 s until ``predicate`` holds (bounded by ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = screen()
        if predicate(text):
            return text
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; screen:\n{screen()}")

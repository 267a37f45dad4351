"""Shared fixtures: isolated TPUWATCH_HOME, and running real scripts under the real agent; the test
lanes (``tf`` tests skipped where TensorFlow is not installed) and hypothesis' profiles."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from alone_lane import pytest_runtest_protocol  # noqa: F401  (the ``alone`` marker's lock)
from tpuwatch_testing import AgentRun, child_env, read_messages

# CI (CI=true) draws the same examples every run, a bounded number, and keeps no database: a
# failure there is one anybody can reproduce with HYPOTHESIS_PROFILE=ci. Elsewhere hypothesis
# explores (tests still bound their own max_examples).
settings.register_profile("ci", derandomize=True, database=None, deadline=None, max_examples=100,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

# Found, not imported: importing TensorFlow at collection costs every xdist worker seconds and
# ~0.5 GB. A test that needs it is marked ``tf`` and imports it inside the test.
HAVE_TF = importlib.util.find_spec("tensorflow") is not None
NO_TF = ("needs TensorFlow, which is not installed here: pip install -e '.[dev]' for the full suite, "
         "or run the fast lane: pytest -m 'not tf and not slow'")


@pytest.fixture
def sigint_default():
    """Every test starts with SIGINT as Python sets it up (the default handler, unblocked), and
    the processes it starts inherit that. CI found five SIGINT tests (a script killing itself by
    SIGINT, ``stop``, Ctrl-C to ``tpuwatch run``) failing only late in one xdist worker, each
    passing alone: a child started with SIGINT ignored or blocked keeps it so, as Python does."""
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)  # also what C code may have set
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


def pytest_collection_finish(session):
    if "tensorflow" in sys.modules:
        raise pytest.UsageError(
            "a test module imported TensorFlow at collection (every xdist worker pays for it, and the fast lane "
            "cannot run without it): import it inside the test (the tf fixture) and mark the test tf")


def pytest_collection_modifyitems(config, items):
    if HAVE_TF:
        return
    skip = pytest.mark.skip(reason=NO_TF)
    for item in items:
        if item.get_closest_marker("tf") is not None:
            item.add_marker(skip)


@pytest.fixture
def tf():
    """TensorFlow, imported when a ``tf`` test runs (never at collection)."""
    import tensorflow

    return tensorflow


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("tpuwatch-home")
    monkeypatch.setenv("TPUWATCH_HOME", str(home))
    monkeypatch.delenv("TPUWATCH_RUN_DIR", raising=False)
    monkeypatch.delenv("TPUWATCH_RUN_ID", raising=False)
    return home


@pytest.fixture
def run_agent(tmp_path):
    """Runs ``python -m tpuwatch.agent SCRIPT ARGS`` as a real subprocess; returns an AgentRun."""

    def run(script: Path | str, *args: str, timeout: float = 180, env: dict | None = None, agent_args=()) -> AgentRun:
        run_dir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        cmd = [sys.executable, "-m", "tpuwatch.agent", "--run-dir", str(run_dir), *agent_args, str(script), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env(**(env or {})),
                              cwd=tmp_path)
        events = run_dir / "events.jsonl"
        messages = read_messages(events) if events.exists() else []
        return AgentRun(proc.returncode, proc.stdout + proc.stderr, run_dir, messages)

    return run

"""The ``alone`` marker (tests/alone_lane.py) under ``pytest -n 2``, as CI runs it: a real pytest
with two xdist workers over generated tests that write down when each ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

CONFTEST = "from alone_lane import pytest_runtest_protocol  # noqa: F401\n"
TIMED = """
import json, os, time
from pathlib import Path

import pytest


def ran(name, seconds):
    t0 = time.monotonic()
    time.sleep(seconds)
    Path(os.environ["LANE_LOG"], name).write_text(json.dumps([t0, time.monotonic(), os.environ["PYTEST_XDIST_WORKER"]]))


@pytest.fixture(scope="module")
def module_work():
    # set up by each worker in the first test that asks for it, under that test's lock
    ran("module_setup_" + os.environ["PYTEST_XDIST_WORKER"], 0.5)
"""


def test_an_alone_test_runs_with_no_other_test_beside_it(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    alone: runs by itself\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    shared = [f"def test_shared_{i}(module_work):\n    ran('shared_{i}', 0.3)\n" for i in range(8)]
    # the alone tests come in the middle of the files, so the other worker is busy when they start
    (tmp_path / "test_timed.py").write_text(TIMED + "\n".join(
        shared[:4] + ["@pytest.mark.alone\ndef test_alone_a():\n    ran('alone_a', 0.8)\n"] + shared[4:]
        + ["@pytest.mark.alone\ndef test_alone_b():\n    ran('alone_b', 0.8)\n"]))
    log = tmp_path / "log"
    log.mkdir()
    env = {**os.environ, "PYTHONPATH": str(TESTS), "LANE_LOG": str(log)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    spans = {p.name: json.loads(p.read_text()) for p in log.iterdir()}
    assert len(spans) == 12, sorted(spans)
    assert len({worker for _, _, worker in spans.values()}) == 2, spans  # both workers ran tests
    for alone in ("alone_a", "alone_b"):
        a0, a1, _ = spans[alone]
        beside = [name for name, (t0, t1, _) in spans.items() if name != alone and t0 < a1 and t1 > a0]
        assert beside == [], (alone, beside, spans)

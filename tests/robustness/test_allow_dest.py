"""`tpuwatch run --allow-dest DIR` hands the allowed destinations to the agent (absolute paths)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpuwatch_testing import child_env

pytestmark = pytest.mark.tf

SCRIPT = Path(__file__).resolve().parent / "scripts" / "print_env.py"


def test_allow_dest_reaches_the_agent_as_absolute_paths(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", "--allow-dest", "ckpts",
                           "--allow-dest", str(tmp_path / "other"), str(SCRIPT)],
                          capture_output=True, text=True, env=child_env(), cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("ALLOWED="))
    assert line == "ALLOWED=" + os.pathsep.join([str(tmp_path / "ckpts"), str(tmp_path / "other")])


def test_without_allow_dest_nothing_extra_is_allowed(tmp_path):
    env = child_env()
    env.pop("TPUWATCH_ALLOWED_DESTINATIONS", None)
    proc = subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", str(SCRIPT)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "ALLOWED=<unset>" in proc.stdout

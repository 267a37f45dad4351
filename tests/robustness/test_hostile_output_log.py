"""`tpuwatch attach` of a run whose output.log is not a file of text: /dev/zero (endless) or a
FIFO (no writer). The summary's "last line of output" must neither read without end (7.2 GB in
20 s before, enough to exhaust the host's memory, training's included) nor wait for a writer."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tpuwatch_testing import child_env

CRASHED = Path(__file__).resolve().parents[1] / "data" / "crashed.jsonl"


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # so an endless read fails, not the host


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo"])
def test_attach_of_a_run_whose_output_log_is_endless_or_a_fifo_ends(tmp_path, kind):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_bytes(CRASHED.read_bytes())
    if kind == "fifo":
        os.mkfifo(run_dir / "output.log")
    else:
        (run_dir / "output.log").symlink_to(kind)
    proc = subprocess.run([sys.executable, "-m", "tpuwatch", "attach", str(run_dir)], capture_output=True, text=True,
                          timeout=60, preexec_fn=_limit_memory, env=child_env(TPUWATCH_HOME=str(tmp_path / "home")))
    assert proc.returncode == 1, proc.stderr  # the run's own exit code
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr[-2000:]
    assert "crashed" in proc.stdout


@pytest.mark.tf
def test_run_says_where_it_records_and_how_to_report_in_one_line_each(tmp_path):
    """`tpuwatch run` of a script whose name holds an OSC title sequence and a newline."""
    script = tmp_path / "evil\x1b]0;pwned\x07\nx.py"
    script.write_text("print('hi')\n")
    proc = subprocess.run([sys.executable, "-m", "tpuwatch", "run", "--headless", str(script)], capture_output=True,
                          timeout=120, env=child_env(TPUWATCH_HOME=str(tmp_path / "home")))
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr.decode("utf-8", "surrogateescape")
    assert "\x1b" not in err and "\x07" not in err, err
    lines = err.splitlines()
    (recording,) = [line for line in lines if "recording in" in line]
    (hint,) = [line for line in lines if "for the full report" in line]
    (run_dir,) = (tmp_path / "home" / "runs").iterdir()
    assert recording.endswith(str(run_dir)) and "evil_]0;pwned__x" in recording, recording
    assert hint.startswith("tpuwatch: exit code 0; `tpuwatch report ") and run_dir.name in hint, hint

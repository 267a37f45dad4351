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


RAISES_WHEN_TOLD = """
import os, sys, time
ready, stop = sys.argv[1], sys.argv[2]
open(ready, "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(stop) and time.monotonic() < deadline:
    time.sleep(0.05)
raise ValueError("planted after the run directory was removed")
"""


@pytest.mark.tf
def test_removing_the_run_directory_mid_run_leaves_the_viewer_watching(tmp_path):
    """`rm -rf` of the run directory while `tpuwatch run --headless` watches: the script runs to its
    end, the viewer says once what it can no longer record and exits with the script's code.
    Before: FileNotFoundError from appending the crash finding to the removed recording."""
    import shutil
    import time

    script = tmp_path / "train.py"
    script.write_text(RAISES_WHEN_TOLD)
    ready, stop, run_dir = tmp_path / "ready", tmp_path / "stop", tmp_path / "run"
    viewer = subprocess.Popen([sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(run_dir),
                               str(script), str(ready), str(stop)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=child_env(TPUWATCH_HOME=str(tmp_path / "home")))
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert time.monotonic() < deadline and viewer.poll() is None, viewer.communicate()
            time.sleep(0.05)
        shutil.rmtree(run_dir)
        stop.write_text("")
        out, err = viewer.communicate(timeout=60)
    finally:
        if viewer.poll() is None:
            viewer.kill()
            viewer.communicate()
    assert "Traceback" not in err, err
    assert viewer.returncode == 1, err  # the script's own exit code


def test_a_finding_made_after_the_run_directory_was_removed_is_said_not_fatal(tmp_path):
    """The headless viewer of `tpuwatch run` records its findings into the recording; a stall
    found after `rm -rf` of the run directory cannot be. Before: FileNotFoundError out of
    ``recording.append`` ended the viewer (exit 1, training unwatched, no Ctrl-C forwarding)."""
    import io
    import json
    import shutil

    from tpuwatch.console import headless

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # The steps of a run whose agent sends no samples (the stall is then measured up to now).
    lines = [line for line in CRASHED.read_text().splitlines()
             if json.loads(line)["kind"] in ("hello", "config") or
             (json.loads(line)["kind"] == "step" and json.loads(line)["step"] <= 100)]
    (run_dir / "events.jsonl").write_text("\n".join(lines) + "\n")
    now = [max(json.loads(line)["t"] for line in lines)]
    polls = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == 1:
            shutil.rmtree(run_dir)  # after the first read
        now[0] += 20.0

    alive = iter([True] * 30 + [False] * 1000)
    out = io.StringIO()
    snap = headless.follow(run_dir / "events.jsonl", lambda: next(alive), out=out, clock=lambda: now[0], poll_s=0.0,
                           sleep=sleep, record_findings=True)
    text = out.getvalue()
    assert "stall" in text and any(f.rule == "stall" for f in snap.findings), text
    (said,) = [line for line in text.splitlines() if "cannot record findings" in line]
    assert str(run_dir) in said and "No such file or directory" in said, said

"""One line, not a traceback, where the CLI promises one: a file where
TPUWATCH_HOME or runs/ should be, a corrupt run.json, events.jsonl a directory or not a
recording, and readers that go away (`tpuwatch ls | head`, `tpuwatch run ... 2>&1 | head -3`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpuwatch_testing import child_env

ROBUSTNESS = Path(__file__).resolve().parents[1] / "robustness"
sys.path.insert(0, str(ROBUSTNESS))
from hard_edges import meta, one_line_error, tpuwatch, write_script  # noqa: E402


@pytest.mark.parametrize("what", ["home", "runs"])
@pytest.mark.parametrize("command", [["ls"], ["attach"], ["report"], ["replay"]])
def test_a_file_where_the_runs_should_be(tmp_path, what, command):
    home = tmp_path / "home"
    if what == "home":
        home.write_text("")
    else:
        home.mkdir()
        (home / "runs").write_text("")
    proc = tpuwatch(*command, env={"TPUWATCH_HOME": str(home)})
    one_line_error(proc, "is a file, not a directory", "TPUWATCH_HOME")


def _fake_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    return run


def test_report_on_a_corrupt_run_json_without_events(tmp_path):
    run = _fake_run(tmp_path)
    (run / "run.json").write_text("{not json")
    one_line_error(tpuwatch("report", str(run)), "run.json", "not valid JSON")


@pytest.mark.parametrize("command", ["report", "replay"])
def test_events_jsonl_is_a_directory(tmp_path, command):
    run = _fake_run(tmp_path)
    (run / "events.jsonl").mkdir()
    one_line_error(tpuwatch(command, str(run)), "events.jsonl is not a file")


@pytest.mark.parametrize("command", ["report", "replay"])
def test_a_binary_file_is_not_a_recording(tmp_path, command):
    run = _fake_run(tmp_path)
    (run / "events.jsonl").write_bytes(os.urandom(3000).replace(b"\n", b"x") + b"\n" + os.urandom(500))
    one_line_error(tpuwatch(command, str(run)), "is not a tpuwatch recording")


def test_ls_into_head(tmp_path):
    """`tpuwatch ls | head -1` with more runs than a pipe holds: no BrokenPipeError traceback."""
    runs = tmp_path / "home" / "runs"
    for i in range(1200):
        d = runs / f"20261123-000000-run{i:04d}-{'x' * 20}"
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps({"run_id": d.name, "script": "train.py", "started": 1.0 + i,
                                                "exit_code": 0, "state": "finished"}))
    proc = subprocess.run(["bash", "-c", f"{sys.executable} -m tpuwatch ls 2>{tmp_path / 'err'} | head -1; "
                                         "echo ${PIPESTATUS[0]}"],
                          capture_output=True, text=True, env=child_env(TPUWATCH_HOME=str(tmp_path / "home")),
                          timeout=120)
    first, code = proc.stdout.splitlines()
    assert first.startswith("RUN")
    assert (tmp_path / "err").read_text() == ""
    assert code in ("0", "141"), code


@pytest.mark.tf
def test_run_headless_into_head(tmp_path):
    """`tpuwatch run --headless x.py 2>&1 | head -3`: the launcher outlives its reader, records
    the end and exits with the script's code. Before: exit 1, run.json left "running"."""
    script = write_script(tmp_path / "chatty.py", """
        import time
        for i in range(3000):
            print("line", i, "x" * 60)
        time.sleep(1.0)  # head has gone by now: tpuwatch's own last lines hit the closed pipe
    """)
    proc = subprocess.run(["bash", "-c", f"{sys.executable} -m tpuwatch run --headless {script} 2>&1 | head -3; "
                                         "echo ${PIPESTATUS[0]}"],
                          capture_output=True, text=True, env=child_env(), timeout=180)
    *shown, code = proc.stdout.splitlines()
    assert len(shown) == 3
    assert code == "0", proc.stdout + proc.stderr
    (run_dir,) = (Path(os.environ["TPUWATCH_HOME"]) / "runs").iterdir()
    assert meta(run_dir)["state"] == "finished" and meta(run_dir)["exit_code"] == 0

"""What a run directory may hold besides a
run's files must never hang or exhaust a viewer, nor print a traceback.

- run.json a FIFO (no writer: a plain open waits forever), run.json a link to /dev/zero (endless),
  events.jsonl a FIFO: ``ls``, ``report``, ``attach`` and ``replay`` say so in one line per bad
  run, and ``ls`` still lists the others.
- run.json nested 100,000 deep (RecursionError), times of 1e300 (OverflowError in a date).
- A recorded exit code that is not a shell's (256): ``attach`` into a file must not exit 0.

Each bad run is a copy of a real recorded run (``tpuwatch run``) with one file replaced."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tpuwatch import rundir

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hard_edges import one_line_error, tpuwatch, write_script  # noqa: E402

# Every test here starts a real agent (TensorFlow), directly or through a fixture.
pytestmark = pytest.mark.tf

#: Far more than any of these commands needs on a good run; a hang ends here (and fails).
LIMIT_S = 60


@pytest.fixture
def good(tmp_path) -> Path:
    script = write_script(tmp_path / "short.py", """
        print("hello from the script")
    """)
    proc = tpuwatch("run", "--headless", str(script))
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = rundir.runs_root().iterdir()
    return run_dir


def _copy(good: Path, name: str) -> Path:
    bad = good.parent / name
    shutil.copytree(good, bad)
    meta = json.loads((bad / rundir.META).read_text())
    meta["run_id"] = name
    (bad / rundir.META).write_text(json.dumps(meta))
    return bad


def _fifo_meta(good: Path) -> Path:
    bad = _copy(good, "fifo-meta")
    (bad / rundir.META).unlink()
    os.mkfifo(bad / rundir.META)
    return bad


def _zero_meta(good: Path) -> Path:
    bad = _copy(good, "zero-meta")
    (bad / rundir.META).unlink()
    (bad / rundir.META).symlink_to("/dev/zero")
    return bad


def _fifo_events(good: Path) -> Path:
    bad = _copy(good, "fifo-events")
    (bad / rundir.EVENTS).unlink()
    os.mkfifo(bad / rundir.EVENTS)
    return bad


BAD = {"fifo-meta": (_fifo_meta, "run.json is a FIFO"),
       "zero-meta": (_zero_meta, "run.json is a character device"),
       "fifo-events": (_fifo_events, "events.jsonl is a FIFO")}


def test_ls_lists_the_good_runs_and_one_line_per_bad_one(good):
    for make, _ in BAD.values():
        make(good)
    proc = tpuwatch("ls", timeout=LIMIT_S)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert good.name in proc.stdout and not any(name in proc.stdout for name in BAD)
    lines = proc.stderr.splitlines()
    assert len(lines) == len(BAD), proc.stderr
    for name, (_, words) in BAD.items():
        (line,) = [line for line in lines if line.startswith(f"tpuwatch: {name}: ")]
        assert words in line and "not a regular file; remove it" in line


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("command", ["report", "attach", "replay"])
def test_a_special_file_is_one_line(good, bad, command):
    make, words = BAD[bad]
    path = make(good)
    for ref in (bad, str(path)):  # by id (looked up under the home) and by path
        one_line_error(tpuwatch(command, ref, timeout=LIMIT_S), words, "remove it")


def test_attach_without_a_run_skips_a_bad_one(good):
    """``attach`` with no argument looks at every run (for the newest running one)."""
    _fifo_meta(good)
    _zero_meta(good)
    proc = tpuwatch("attach", timeout=LIMIT_S)
    assert "Traceback" not in proc.stderr and proc.returncode == 0, proc.stderr


def test_a_100k_deep_run_json_is_no_traceback(good):
    (good / rundir.META).write_text("[" * 100_000 + "]" * 100_000)
    for args in (["ls"], ["report", good.name], ["attach", good.name]):
        proc = tpuwatch(*args, timeout=LIMIT_S)
        assert "Traceback" not in proc.stderr and proc.returncode == 0, (args, proc.stderr)


def test_times_of_1e300_are_no_traceback(good):
    meta = json.loads((good / rundir.META).read_text())
    meta.update(started=1e300, ended=1e300)
    (good / rundir.META).write_text(json.dumps(meta))
    lines = []
    for line in (good / rundir.EVENTS).read_text().splitlines():
        record = json.loads(line)
        if "t" in record:
            record["t"] = 1e300
        lines.append(json.dumps(record, separators=(",", ":")))
    (good / rundir.EVENTS).write_text("\n".join(lines) + "\n")
    proc = tpuwatch("ls", timeout=LIMIT_S)
    assert "Traceback" not in proc.stderr and proc.returncode == 0, proc.stderr
    # A time beyond 1e11 s makes its line malformed: here every line, so no recording is left.
    for args in (["report", good.name], ["report", good.name, "--format", "markdown"],
                 ["report", good.name, "--format", "json"], ["attach", good.name]):
        proc = tpuwatch(*args, timeout=LIMIT_S)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        assert proc.returncode == 0 or (proc.returncode == 2 and proc.stderr.count("\n") == 1
                                        and "is not a time in seconds" in proc.stderr), (args, proc.stderr)


@pytest.mark.parametrize(("recorded", "shell"), [(256, 1), (-9, 137), (1000, 1), (3, 3)])
def test_attach_exits_with_a_shell_valid_code(good, recorded, shell):
    """A recorded code outside 0-255 would be cut to its low byte (256 -> 0, "success")."""
    lines = []
    for line in (good / rundir.EVENTS).read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "exit":
            record["exit_code"] = recorded
        lines.append(json.dumps(record, separators=(",", ":")))
    (good / rundir.EVENTS).write_text("\n".join(lines) + "\n")
    meta = json.loads((good / rundir.META).read_text())
    meta["exit_code"] = recorded
    (good / rundir.META).write_text(json.dumps(meta))
    proc = tpuwatch("attach", good.name, timeout=LIMIT_S)
    assert proc.returncode == shell, (proc.returncode, proc.stderr)

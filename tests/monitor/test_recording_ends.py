"""A recording's two ends, each read in one place: its head decides whether it
is a recording at all (``report``, ``replay``, ``attach`` and ``export`` ask the same question and
get the same answer), its tail holds the exit record (``ls``, the launcher, stopping a run)."""

from __future__ import annotations

from pathlib import Path

from tpuwatch import protocol, rundir
from tpuwatch.commands.dashboard import nothing_to_show
from tpuwatch.console.report import build_report

DATA = Path(__file__).resolve().parents[1] / "data"


def _run(tmp_path: Path, text: bytes) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / rundir.EVENTS).write_bytes(text)
    return run


def test_a_stray_first_line_leaves_a_recording_readable_by_every_command(tmp_path):
    # A line the decoder cannot read is counted and skipped everywhere else in a recording; the
    # first one was judged apart by report (first line only) and by the viewers (any of the head).
    run = _run(tmp_path, b"not json\n" + (DATA / "crashed.jsonl").read_bytes())
    assert nothing_to_show(run) == ""
    assert build_report(run)["run"]["id"] == "20250615-120000-train-ab12"


def test_a_hello_still_being_written_is_not_called_a_foreign_file(tmp_path):
    hello = (DATA / "crashed.jsonl").read_bytes().split(b"\n", 1)[0]
    run = _run(tmp_path, hello[:40])  # the agent has not finished its first line yet
    assert nothing_to_show(run) == ""


def test_a_foreign_file_is_said_in_one_line_by_every_command(tmp_path):
    run = _run(tmp_path, b"a,b,c\n1,2,3\n")
    problem = nothing_to_show(run)
    assert "is not a tpuwatch recording" in problem
    try:
        build_report(run)
    except Exception as e:  # noqa: BLE001 - the type is checked below
        assert type(e).__name__ == "ReportError" and str(e) == problem
    else:
        raise AssertionError("report read a foreign file as a recording")


def test_the_last_exit_record_is_read_from_the_tail(tmp_path):
    from tpuwatch.monitor.recording import last_exit

    ended = last_exit(_run(tmp_path, (DATA / "crashed.jsonl").read_bytes()) / rundir.EVENTS)
    assert isinstance(ended, protocol.Exit) and ended.exit_code == 1
    assert last_exit(DATA / "waiting.jsonl") is None
    assert last_exit(tmp_path / "missing.jsonl") is None

"""Text from the run reaches the terminal with its control characters
shown escaped (``ls``, ``report`` as text and markdown, ``attach`` into a file or pipe, the
headless lines), and a newline in a script name does not break the ``ls`` table."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

from tpuwatch import protocol, rundir
from tpuwatch.console import headless
from tpuwatch.printable import one_line, printable

ROBUSTNESS = Path(__file__).resolve().parents[1] / "robustness"
MONITOR = Path(__file__).resolve().parents[1] / "monitor"
sys.path[:0] = [str(ROBUSTNESS), str(MONITOR)]
from hard_edges import tpuwatch  # noqa: E402
from monitor_recordings import mr, write_run  # noqa: E402

#: OSC 52 (writes the clipboard), OSC 0 (window title), ESC c (full reset), ESC 7 / ESC 8 (cursor
#: save/restore), 8-bit CSI and OSC, DEL, and a newline where one line is expected.
HOSTILE = "\x1b]52;c;cHduZWQ=\x07\x1b]0;pwned\x07\x1bc\x1b7\x1b8\x9b2J\x9d0;t\x9c\x7f\nnext"
#: Bytes a terminal acts on (UTF-8 encodes C1 as \xc2\x80-\xc2\x9f); newline and tab excluded.
CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")


def assert_no_controls(data: str) -> None:
    raw = data.encode("utf-8", "surrogateescape")
    found = CONTROL.search(raw)
    assert found is None, (found, data[-2000:])


def test_printable_escapes_every_control_and_keeps_the_rest():
    assert printable(HOSTILE) == ("\\x1b]52;c;cHduZWQ=\\x07\\x1b]0;pwned\\x07\\x1bc\\x1b7\\x1b8\\x9b2J"
                                  "\\x9d0;t\\x9c\\x7f\nnext")
    assert one_line("a\nb\tc\rd") == "a\\nb\\tc\\rd"
    assert printable("a\tb\nc") == "a\tb\nc"
    assert printable("x\udcffy") == "x\\udcffy"  # a lone surrogate no UTF-8 terminal stream takes
    text = "loss 0.25 · 3× CPU ✓ [lr=0.1] /etc/x[/]y é"
    assert printable(text) is text and one_line(text) is text


def hostile_run(home: Path) -> Path:
    """A crashed run whose script name, exception, finding and run id carry terminal controls."""
    run_id = "20261125-120000-evil\x1b]0;id\x07"
    msgs = mr.crashed_messages(60, nan_at=50)
    msgs[0] = mr.hello(script=f"tr{HOSTILE}ain.py", run_id=run_id)
    at = next(i for i, m in enumerate(msgs) if isinstance(m, protocol.ExceptionRaised))
    t = msgs[at].t
    msgs[at:at + 1] = [
        protocol.ExceptionRaised(t=t, type="ValueError", message=f"bad {HOSTILE}",
                                 traceback=f"Traceback (most recent call last):\nValueError: bad {HOSTILE}\n"),
        protocol.Finding(t=t, rule="custom", severity="warning", message=f"finding {HOSTILE}",
                         advice=f"advice {HOSTILE}"),
    ]
    run = home / "runs" / run_id
    write_run(run, msgs, meta={"run_id": run_id, "script": f"tr{HOSTILE}ain.py", "started": msgs[0].t,
                               "exit_code": 1, "state": "crashed"})
    return run


def test_ls_report_and_attach_escape_controls_from_the_run(tmp_path):
    home = tmp_path / "home"
    run = hostile_run(home)
    env = {"TPUWATCH_HOME": str(home), "COLUMNS": "400"}

    ls = tpuwatch("ls", env=env)
    assert ls.returncode == 0, ls.stderr
    assert_no_controls(ls.stdout + ls.stderr)
    lines = ls.stdout.splitlines()
    assert len(lines) == 2, lines  # the header and one run: the newline in the name is escaped
    assert "tr\\x1b]52;c;cHduZWQ=\\x07" in lines[1] and "\\nnext" in lines[1]
    assert "evil\\x1b]0;id\\x07" in lines[1]

    for fmt in ("text", "markdown"):
        rep = tpuwatch("report", str(run), "--format", fmt, env=env)
        assert rep.returncode == 0, rep.stderr
        assert_no_controls(rep.stdout + rep.stderr)
        for shown in ("tr\\x1b]52;c;cHduZWQ=\\x07", "bad \\x1b]52;c;", "finding \\x1b]52;c;", "advice \\x1b]52;"):
            assert shown in rep.stdout, (fmt, shown, rep.stdout)
        (script,) = [line for line in rep.stdout.splitlines() if "script" in line and "tr\\x1b" in line]
        assert "\\x7f\\nnextain.py" in script  # the name's newline does not break the row

    # attach into a file or a pipe: the headless lines.
    att = tpuwatch("attach", str(run), env=env)
    assert_no_controls(att.stdout + att.stderr)
    assert "tr\\x1b]52;c;cHduZWQ=\\x07" in att.stdout + att.stderr


def test_headless_lines_escape_controls_from_the_run(tmp_path):
    run = hostile_run(tmp_path / "home")
    out = io.StringIO()
    headless.follow(run / rundir.EVENTS, lambda: False, out=out, poll_s=0.0, sleep=lambda s: None)
    text = out.getvalue()
    assert_no_controls(text)
    assert "[warning] custom: finding \\x1b]52;c;" in text
    assert "  error     ValueError: bad \\x1b]52;c;" in text
    assert "tpuwatch: tr\\x1b]52;c;cHduZWQ=\\x07" in text and "\\x7f\\nnextain.py crashed (exit 1)" in text


def test_a_command_result_from_the_agent_is_printed_escaped(tmp_path, monkeypatch, capsys):
    # `tpuwatch checkpoint RUN --dir '/etc/x[/]y'`: the agent's answer quotes the path it was given.
    from tpuwatch.control import actions

    def answer(run_dir, command, timeout_s, on_state, **kwargs):
        result = protocol.Result(t=1.0, id=command.id, action="checkpoint", ok=False,
                                 message=f"cannot write /etc/x[/]y{HOSTILE}")
        return actions.Outcome(command, 1.0, (), result, False)

    monkeypatch.setattr(actions, "send_and_wait", answer)
    code = actions.request(tmp_path, "checkpoint", timeout_s=1.0, dest_dir="/etc/x[/]y")
    out = capsys.readouterr()
    assert code == actions.EXIT_FAILED
    assert_no_controls(out.out + out.err)
    assert "checkpoint failed: cannot write /etc/x[/]y\\x1b]52;c;cHduZWQ=\\x07" in out.out


def test_the_headless_summarys_run_row_is_one_line(tmp_path):
    """A run id (from the recording's hello) with a newline and an OSC title sequence."""
    home = tmp_path / "home"
    msgs = mr.crashed_messages(60, nan_at=50)
    msgs[0] = mr.hello(script="train.py", run_id="evil\x1b]0;pwned\x07\nfake row")
    run = home / "runs" / "r"
    write_run(run, msgs, meta={"run_id": "r", "script": "train.py", "started": msgs[0].t, "exit_code": 1,
                               "state": "crashed"})
    out = io.StringIO()
    headless.follow(run / rundir.EVENTS, lambda: False, out=out, poll_s=0.0, sleep=lambda s: None)
    text = out.getvalue()
    assert_no_controls(text)
    (row,) = [line for line in text.splitlines() if line.startswith("  run ")]
    assert "evil\\x1b]0;pwned\\x07\\nfake row" in row, text
    assert not any(line.startswith("fake row") for line in text.splitlines())


def test_ls_of_a_directory_with_a_hostile_run_directory_name_and_a_fifo_run_json(tmp_path):
    runs = tmp_path / "runs"
    bad = runs / "evil\x1b]0;pwned\x07\nname"
    bad.mkdir(parents=True)
    import os

    os.mkfifo(bad / rundir.META)
    ls = tpuwatch("ls", str(runs), env={"TPUWATCH_HOME": str(tmp_path / "home")}, timeout=60)
    assert "Traceback" not in ls.stderr, ls.stderr
    assert_no_controls(ls.stdout + ls.stderr)
    (line,) = [line for line in ls.stderr.splitlines() if "pwned" in line]
    assert "evil\\x1b]0;pwned\\x07\\nname" in line and "FIFO" in line, ls.stderr
    assert not any(line.startswith("name") for line in ls.stderr.splitlines()), ls.stderr


def test_a_new_run_id_keeps_no_control_character_of_the_scripts_name():
    run_id = rundir.new_run_id("/tmp/evil\x1b]0;pwned\x07\nx \udcff名前.py", clock=lambda: 0.0)
    stem = run_id.split("-", 2)[2].rsplit("-", 1)[0]
    assert stem == "evil_]0;pwned__x__名前", run_id

"""Wrong or closed endpoints and garbage recordings say what is wrong: the
header names the problem instead of "waiting", Stop is not offered, and the CLI exits non-zero
with one line when nothing at all can be shown."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from ui_support import FakeClock, screen_text, sync

from tpuwatch import cli, rundir
from tpuwatch.control import launcher
from tpuwatch.sources.file_source import FileSource
from tpuwatch.ui.app import TpuwatchApp
from tpuwatch.ui.screens.quit_screen import QuitScreen

GARBAGE = b"PK\x03\x04 not json\n{\"hello\": 1}\n\xff\xfe\n"


def _garbage_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    rundir.create(run)
    (run / rundir.EVENTS).write_bytes(GARBAGE)
    (run / rundir.OUTPUT).write_text("")
    return run


@sync
async def test_garbage_recording_is_named_in_the_header_and_q_just_quits(tmp_path) -> None:
    run = _garbage_run(tmp_path)
    app = TpuwatchApp(FileSource(run, send=lambda c: None), run_dir=run, clock=FakeClock(1e9), refresh_hz=0)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        text = screen_text(app)
        assert "NO DATA" in text and "WAITING" not in text
        assert "3 unreadable line(s) and no tpuwatch message" in text
        assert "waiting for the agent's first message" not in text
        await pilot.press("q")
        assert not isinstance(app.screen, QuitScreen)  # nothing to stop: no Stop offered
    assert app.return_value == "quit"


def test_replay_of_a_garbage_recording_exits_non_zero_with_one_line(tmp_path, capsys) -> None:
    run = _garbage_run(tmp_path)
    assert cli.main(["replay", str(run)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a tpuwatch recording" in err[0], err


def test_attach_to_a_closed_port_exits_non_zero_naming_it(tmp_path, capsys) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = tmp_path / "token"
    token.write_text("x" * 32)
    assert cli.main(["attach", f"127.0.0.1:{port}", "--token-file", str(token)]) == 1
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in err and "not accepting viewers" in err, err


def _listening_run(tmp_path: Path) -> tuple[launcher.Launch, str]:
    """A real agent on 127.0.0.1 (a script that sleeps), and its address once it listens."""
    script = tmp_path / "train.py"
    script.write_text("import time\nfor i in range(100000):\n    time.sleep(0.05)\n")
    launch = launcher.start(str(script), [], run_dir=tmp_path / "run", listen="127.0.0.1:0")
    deadline = time.monotonic() + 60
    while not rundir.read_meta(launch.run_dir).get("tcp"):
        if time.monotonic() > deadline or not launch.alive():
            launch.proc.kill()
            raise AssertionError((launch.run_dir / rundir.OUTPUT).read_text())
        time.sleep(0.1)
    return launch, rundir.read_meta(launch.run_dir)["tcp"]


@pytest.mark.tf
def test_attach_with_a_wrong_token_exits_non_zero_saying_so(tmp_path, capsys) -> None:
    launch, address = _listening_run(tmp_path)
    try:
        wrong = tmp_path / "wrong-token"
        wrong.write_text("0" * 32)
        assert cli.main(["attach", address, "--token-file", str(wrong)]) == 1
        err = capsys.readouterr().err
        assert f"{address} refused this viewer" in err and "token" in err, err
    finally:
        launch.proc.kill()
        launch.proc.wait()


@pytest.mark.tf
def test_attach_to_a_live_agent_into_a_pipe_needs_a_terminal(tmp_path, capsys, monkeypatch) -> None:
    """The agent answers, but stdout is a pipe: one line saying so, not a dashboard's escape codes
    into the pipe waiting for keys."""
    launch, address = _listening_run(tmp_path)
    try:
        monkeypatch.setattr(cli.sys.stdout, "isatty", lambda: False)
        token = launch.run_dir / rundir.TOKEN
        assert cli.main(["attach", address, "--token-file", str(token)]) == 2
        err = capsys.readouterr().err
        assert "needs a terminal" in err and len(err.strip().splitlines()) == 1, err
    finally:
        launch.proc.kill()
        launch.proc.wait()

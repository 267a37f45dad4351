"""Stop from a viewer that did not start the run (`tpuwatch attach`): training really ends, the
grace periods are printed, and the run is recorded and listed as stopped (exit 130)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tpuwatch import cli, rundir
from tpuwatch.commands import dashboard
from tpuwatch.control import launcher, run_stop
from tpuwatch.monitor.runs import ended_state, run_info
from tpuwatch.monitor.state import RunState
from tpuwatch.protocol import STOP_SOURCE, Event, EventFact, Exit, Hello

pytestmark = pytest.mark.usefixtures("sigint_default")  # the stops send SIGINT first

# A pure-Python "training" loop: the agent runs it without importing TensorFlow (fast), and the
# test process (not the viewer) is its parent, as the `tpuwatch run` that detached would be.
LOOP = "import time\nfor i in range(100000):\n    print('step', i, flush=True)\n    time.sleep(0.05)\n"
STUBBORN = ("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('ignoring SIGINT', flush=True)\n"
            "for i in range(100000):\n    time.sleep(0.05)\n")


def _start(tmp_path: Path, source: str, ready: bytes = b"") -> launcher.Launch:
    """Starts ``source`` under the agent; returns once the agent said hello and the script printed
    ``ready`` (the agent says hello before the script runs: a signal sent then meets Python's
    default handlers, not the script's)."""
    script = tmp_path / "train.py"
    script.write_text(source)
    launch = launcher.start(str(script), [], run_dir=tmp_path / "run")
    deadline = time.monotonic() + 60
    events = launch.run_dir / rundir.EVENTS
    output = launch.run_dir / rundir.OUTPUT
    try:
        while (not events.exists() or b'"kind":"hello"' not in events.read_bytes()
               or (ready and ready not in output.read_bytes())):
            assert time.monotonic() < deadline, (launch.run_dir / rundir.OUTPUT).read_text()
            assert launch.alive(), (launch.run_dir / rundir.OUTPUT).read_text()
            time.sleep(0.1)
    except BaseException:
        launch.proc.kill()  # never leave a training process behind a failed test
        launch.proc.wait()
        raise
    return launch


@pytest.mark.tf
def test_stop_chosen_in_attach_stops_training_and_lists_it_stopped(tmp_path, monkeypatch, capsys):
    launch = _start(tmp_path, LOOP)
    try:
        # The dashboard's answer is what matters here: the user pressed q, then "Stop training".
        monkeypatch.setattr(dashboard, "show", lambda run_dir, live, **kw: "stop")
        monkeypatch.setattr(cli.sys.stdout, "isatty", lambda: True)  # a dashboard needs a terminal
        code = cli.main(["attach", str(launch.run_dir)])
        err = capsys.readouterr().err
        assert code == 130, err
        assert "sending SIGINT to the training process group; waiting up to 15 s" in err
        assert "training stopped (exit code 130)" in err
        launch.proc.wait(timeout=30)  # it really ended (this test is its parent: reap it)
        info = run_info(launch.run_dir)
        assert (info.state, info.exit_code) == ("stopped", 130)
        meta = rundir.read_meta(launch.run_dir)
        assert meta["state"] == "stopped" and meta["stopped_by"] == "tpuwatch attach"
        state = RunState()
        from tpuwatch.monitor.recording import read_all

        state.apply_all(read_all(launch.run_dir / rundir.EVENTS)[0])
        snap = state.snapshot()
        assert (snap.status, snap.exit_code) == ("stopped", 130)
        from tpuwatch.console.report import build_model, render_text

        assert "stopped (exit 130)" in render_text(build_model(launch.run_dir))
    finally:
        if launch.alive():
            launch.proc.kill()
            launch.proc.wait()


@pytest.mark.tf
def test_a_process_ignoring_sigint_gets_sigterm_after_the_grace_period(tmp_path):
    launch = _start(tmp_path, STUBBORN, ready=b"ignoring SIGINT")
    lines: list[str] = []
    try:
        code = run_stop.stop_runs([launch.run_dir], by="test", grace_int_s=1.0, grace_term_s=10.0,
                                  report=lines.append)
        launch.proc.wait(timeout=30)
    finally:
        if launch.alive():
            launch.proc.kill()
            launch.proc.wait()
    assert code == 143, lines
    assert [line.split(" to ")[0] for line in lines] == ["sending SIGINT", "sending SIGTERM"]
    info = run_info(launch.run_dir)
    assert (info.state, info.exit_code) == ("stopped", 143)


@pytest.mark.tf
def test_stopping_an_ended_run_says_so(tmp_path):
    launch = _start(tmp_path, "print('done')\n")
    launch.proc.wait(timeout=60)
    launcher.finish(launch)
    with pytest.raises(run_stop.StopError, match="already ended"):
        run_stop.stop_runs([launch.run_dir], by="test")


def test_a_run_on_another_host_is_not_signalled(tmp_path):
    run = tmp_path / "run"
    rundir.create(run)
    rundir.write_meta(run, {"host": "some-other-host", "child_pid": 1, "pgid": 1})
    with pytest.raises(run_stop.StopError, match="trains on some-other-host"):
        run_stop.stop_runs([run], by="test")


@pytest.mark.parametrize("code, requested, status", [
    (130, False, "stopped"),   # an interrupt is always someone stopping the run
    (143, True, "stopped"),    # SIGTERM after a recorded stop request
    (143, False, "crashed"),   # SIGTERM from elsewhere
    (1, True, "crashed"),      # the script failed on its own while being stopped
    (0, True, "finished"),
])
def test_status_of_an_ended_run(code, requested, status):
    state = RunState()
    state.apply(Hello(protocol_version=1, agent_version="x", run_id="r", t=1.0, pid=1, host="h", worker="w",
                      python_version="3", tf_version="", keras_version="", script="s.py", argv=()))
    if requested:
        state.apply(Event(t=2.0, level="warning", source=STOP_SOURCE, message="stop requested from test",
                          fact=EventFact.STOP_REQUESTED, subject="test"))
    state.apply(Exit(t=3.0, exit_code=code, signal=code - 128 if code > 128 else None))
    assert state.snapshot(now=3.0).status == status
    assert ended_state(code, requested) == status


def test_detach_from_attach_says_training_goes_on(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    rundir.create(run)
    (run / rundir.EVENTS).write_bytes(b"")
    rundir.write_meta(run, {"run_id": "r-1"})
    monkeypatch.setattr(dashboard, "show", lambda run_dir, live, **kw: "detach")
    monkeypatch.setattr(cli.sys.stdout, "isatty", lambda: True)  # a dashboard needs a terminal
    assert cli.main(["attach", str(run)]) == 0
    # Outside the runs home the id names nothing: the hint names the directory.
    assert f"detached; training goes on. Re-join with `tpuwatch attach {run}`" in capsys.readouterr().err


@pytest.mark.tf
def test_remote_stop_reports_the_agents_answer(tmp_path):
    # A viewer on another host can only ask the agent: it interrupts itself, and the viewer
    # reports the run's end as a stop.
    from tpuwatch.control.remote_stop import stop_remote

    script = tmp_path / "train.py"
    script.write_text(LOOP)
    launch = launcher.start(str(script), [], run_dir=tmp_path / "run", listen="127.0.0.1:0")
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while not rundir.read_meta(launch.run_dir).get("tcp"):
            assert time.monotonic() < deadline and launch.alive()
            time.sleep(0.1)
        host, port = rundir.read_meta(launch.run_dir)["tcp"].rsplit(":", 1)
        token = rundir.read_token(launch.run_dir / rundir.TOKEN)
        code = stop_remote([((host, int(port)), 0)], token, report=lines.append, wait_s=20)
    finally:
        launch.proc.kill()
        launch.proc.wait()
    assert lines[0].startswith(f"{host}:{port}: asked the agent to stop"), lines
    assert code == 130 and "training stopped (exit code 130)" in lines[-1], lines

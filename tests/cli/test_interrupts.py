"""Ctrl-C forwarding (tpuwatch/commands/interrupts.py) installed before the training exists, as
``tpuwatch run`` installs it: the handler in this process, real signals, stand-in processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tpuwatch.commands.interrupts import forward_interrupts


class _Process:
    """What forward_interrupts asks of a process: its group's signals, and whether it lives."""

    def __init__(self) -> None:
        self.signals: list[int] = []

    def signal(self, sig: int) -> None:
        self.signals.append(sig)

    def group_alive(self) -> bool:
        return False  # ended at once: no escalation thread waits on it


@pytest.fixture
def restored_handlers():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.usefixtures("sigint_default", "restored_handlers")
def test_a_ctrl_c_before_the_process_exists_is_sent_once_it_does(capsys):
    launched: list[_Process] = []
    forwarding = forward_interrupts("the training", lambda: list(launched))
    os.kill(os.getpid(), signal.SIGINT)  # the handler runs on this thread before the call returns
    assert forwarding.interrupted
    process = _Process()
    launched.append(process)
    forwarding.catch_up()
    forwarding.catch_up()  # once only
    assert process.signals == [signal.SIGINT]
    os.kill(os.getpid(), signal.SIGINT)  # again: it escalates, as Ctrl-C does after the launch
    assert process.signals == [signal.SIGINT, signal.SIGTERM]
    err = capsys.readouterr().err
    assert "sending SIGINT to the training" in err and "sending SIGTERM to the training" in err, err
    assert not forwarding.hand_over()  # interrupted: the forwarding stays
    assert signal.getsignal(signal.SIGINT) not in (signal.default_int_handler, signal.SIG_DFL)


@pytest.mark.usefixtures("sigint_default", "restored_handlers")
def test_no_ctrl_c_hands_the_handlers_back_and_catch_up_sends_nothing():
    process = _Process()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    forwarding = forward_interrupts("the training", lambda: [process])
    assert signal.getsignal(signal.SIGINT) is not before[signal.SIGINT]
    forwarding.catch_up()
    assert process.signals == [] and not forwarding.interrupted
    assert forwarding.hand_over()
    assert {sig: signal.getsignal(sig) for sig in before} == before


@pytest.mark.usefixtures("restored_handlers")
def test_a_training_started_while_it_is_installed_keeps_its_hangup():
    """Installed before the launch, the hangup is ignored by a Python handler: SIG_IGN would be
    inherited by the training and everything it starts, which under plain python start with the
    hangup at its default (a script's own use of SIGHUP would change)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    forward_interrupts("the training", lambda: [])
    status = subprocess.run([sys.executable, "-c", "print(open('/proc/self/status').read())"],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
    assert not ignored & (1 << (signal.SIGHUP - 1)), hex(ignored)


@pytest.mark.tf
@pytest.mark.usefixtures("sigint_default")
def test_a_sigint_before_the_dashboard_has_the_terminal_stops_the_training(tmp_path, monkeypatch):
    """``tpuwatch run`` on a terminal hands Ctrl-C to the dashboard, where it is a key once Textual
    has the terminal; a SIGINT before that (Textual still importing) raised KeyboardInterrupt out of
    the dashboard, and ``tpuwatch run`` ended with 130 with the training running on, orphaned."""
    from tpuwatch.commands import dashboard, run
    from tpuwatch.control import launcher
    from tpuwatch_testing import child_env

    script = tmp_path / "sleeps.py"
    ready = tmp_path / "ready"
    script.write_text(f"import pathlib, time\npathlib.Path({str(ready)!r}).touch()\ntime.sleep(60)\n")
    launch = launcher.start(str(script), [], run_dir=tmp_path / "run", env=child_env())

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(dashboard, "show", interrupted)
    try:
        # the script's own line runs: a SIGINT in the child's start (the agent importing
        # TensorFlow) ends it with 1 where KeyboardInterrupt at the script's line ends it with 130
        deadline = time.monotonic() + 120
        while not ready.exists() and launch.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the script never started"
        code = run._run_dashboard(launch)
    finally:
        if launch.alive():
            launch.proc.kill()
            launch.proc.wait()
            pytest.fail("the training was left running")
    assert code == 130

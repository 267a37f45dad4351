"""StackRequest: the command's dump when the agent answers; SIGUSR1 and faulthandler's file when
it does not (a hang holding the GIL); a clear failure when neither can work."""

from __future__ import annotations

import signal

from tpuwatch.control.stack_request import StackRequest
from tpuwatch.monitor.snapshot import CommandView
from tpuwatch.protocol import StackDump


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _cmd(status: str, message: str = "", **details) -> CommandView:
    return CommandView(id="stack-1", action="stack_dump", status=status, message=message, details=details, t=0.0)


def test_the_answer_is_the_dump_named_by_the_result(tmp_path):
    clock = Clock()
    req = StackRequest("stack-1", run_dir=tmp_path, pid=123, clock=clock, kill=_no_kill)
    old = StackDump(t=1.0, text="old dump", path="/r/stacks/old.txt")
    req.remember_existing([old])
    assert req.update([_cmd("running")], [old]).status == "waiting"
    new = StackDump(t=2.0, text="Thread MainThread ...", path="/r/stacks/new.txt")
    view = req.update([_cmd("done", path="/r/stacks/new.txt")], [old, new])
    assert (view.status, view.text, view.path) == ("done", "Thread MainThread ...", "/r/stacks/new.txt")


def test_a_refused_command_fails_with_its_reason(tmp_path):
    req = StackRequest("stack-1", run_dir=tmp_path, pid=123, clock=Clock(), kill=_no_kill)
    view = req.update([_cmd("failed", "unknown action 'stack_dump'")], [])
    assert view.status == "failed" and "unknown action" in view.note


def _no_kill(pid: int, sig: int) -> None:
    raise AssertionError("must not signal")


def test_no_answer_on_this_host_sends_sigusr1_and_reads_faulthandlers_file(tmp_path):
    clock = Clock()
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    fault = stacks / "faulthandler.txt"
    fault.write_text("an older dump\n")
    sent: list[tuple[int, int]] = []

    def kill(pid: int, sig: int) -> None:
        sent.append((pid, sig))
        with open(fault, "a") as f:  # what faulthandler's C handler does
            f.write('Current thread 0x1 (most recent call first):\n  File "train.py", line 7 in hang_here\n')

    req = StackRequest("stack-1", run_dir=tmp_path, pid=4242, host="", clock=clock, kill=kill,
                       fallback_after_s=5.0)
    assert req.update([_cmd("pending")], []).status == "waiting"
    clock.t += 4.9
    assert req.update([_cmd("pending")], []).status == "waiting" and not sent
    clock.t += 0.2
    view = req.update([_cmd("pending")], [])
    assert view.status == "signalled" and sent == [(4242, signal.SIGUSR1)]
    clock.t += 0.6
    view = req.update([_cmd("pending")], [])
    assert view.status == "done"
    assert "line 7 in hang_here" in view.text and "an older dump" not in view.text
    assert "SIGUSR1" in view.note


def test_no_answer_from_another_host_fails_with_what_to_do(tmp_path):
    clock = Clock()
    req = StackRequest("stack-1", run_dir=None, pid=4242, host="tpu-vm-7", clock=clock, kill=_no_kill,
                       hostname=lambda: "laptop")
    clock.t += 6
    view = req.update([], [])
    assert view.status == "failed" and "kill -USR1" in view.note


def test_sigusr1_without_a_handler_times_out_clearly(tmp_path):
    clock = Clock()
    req = StackRequest("stack-1", run_dir=tmp_path, pid=4242, clock=clock, kill=lambda pid, sig: None)
    clock.t += 6
    assert req.update([], []).status == "signalled"
    clock.t += 6
    view = req.update([], [])
    assert view.status == "failed" and "SIGUSR1" in view.note


def test_terminal_file_drops_output_once_the_terminal_is_gone():
    from tpuwatch.ui.hangup_driver import TerminalFile

    class DeadTty:
        writes = 0

        def write(self, text):
            self.writes += 1
            raise OSError(5, "Input/output error")

        def flush(self):
            raise OSError(5, "Input/output error")

        def fileno(self):
            return 2

    tty = DeadTty()
    f = TerminalFile(tty)
    assert f.write("frame") == 5  # no exception: Textual's output thread lives on
    f.flush()
    assert f.write("next frame") == 10
    assert f.gone and "Input/output error" in f.error and tty.writes == 1
    assert f.fileno() == 2

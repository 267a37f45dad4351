"""``tpuwatch profile`` / ``tpuwatch checkpoint`` from any shell: one command, its progress, its Result.

The command goes to the agent over its socket (:class:`AgentClient`); its progress
(``CommandState`` queued/running) and its one ``Result`` are read back from the run's recording,
tailed from the offset it had just before sending, so nothing is missed and no second channel is
needed. Exit codes: 0 ok, 1 failed (or no result before ``--timeout``), 2 the run is not live.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, TextIO

from tpuwatch import rundir, units
from tpuwatch.control.client import AgentClient, AgentUnavailable, new_command
from tpuwatch.monitor.recording import RecordingReader, tail_messages
from tpuwatch.printable import printable
from tpuwatch.protocol import Command, CommandState, Epoch, Exit, Message, Result, Retrace, Step

Action = Literal["profile", "checkpoint"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_NOT_LIVE = 2
EXIT_INTERRUPTED = 130
POLL_S = 0.05
#: A queued command says why it waits once no training step has come for this long.
WAIT_HINT_S = 5.0


@dataclass(frozen=True)
class Outcome:
    """What became of one command: its Result (None: timed out or the run ended without one)."""

    command: Command
    sent_t: float  # unix seconds, just before sending
    states: tuple[CommandState, ...]
    result: Result | None
    ended: bool  # the run exited while we waited


def command_for(action: str, *, steps: int | None = None, ms: float | None = None, logdir: str | None = None,
                dest_dir: str | None = None, cwd: Path | None = None) -> Command:
    """The Command for ``tpuwatch profile`` (``steps`` or ``ms``, ``logdir``) or ``tpuwatch
    checkpoint`` (``dest_dir``); local paths made absolute here (the agent's working directory is
    not the shell's). Raises ValueError for another action."""

    def absolute(value: str | None) -> str | None:
        if not value or value.startswith("gs://"):
            return value
        return str((cwd or Path.cwd()) / Path(value).expanduser())

    if action == "profile":
        return new_command("profile", steps=steps, ms=ms, logdir=absolute(logdir))
    if action == "checkpoint":
        return new_command("checkpoint", dir=absolute(dest_dir))
    raise ValueError(f"unknown action {action!r}")


def send_and_wait(
    run_dir: Path,
    command: Command,
    timeout_s: float,
    on_state: Callable[[CommandState], None] = lambda s: None,
    client: AgentClient | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    on_wait: Callable[[str], None] = lambda why: None,
) -> Outcome:
    """Sends ``command`` and follows the recording until its Result. Raises AgentUnavailable.
    ``on_wait`` gets one line on why a queued command waits (no training step for
    ``WAIT_HINT_S``), again only when that reason changes."""
    events = run_dir / rundir.EVENTS
    try:
        offset = events.stat().st_size
    except OSError:
        offset = 0
    reader = RecordingReader(events, offset=offset)
    client = client or AgentClient.for_run(run_dir)
    sent_t = clock()
    try:
        client.send(command)
    finally:
        client.close()
    states: list[CommandState] = []
    ended = False
    deadline = time.monotonic() + timeout_s
    idle = _Idle(tail_messages(events) if offset else [], sent_t)
    said = ""
    while True:
        for msg in reader.read_new():
            idle.see(msg)
            if isinstance(msg, CommandState) and msg.id == command.id:
                states.append(msg)
                on_state(msg)
            elif isinstance(msg, Result) and msg.id == command.id:
                return Outcome(command, sent_t, tuple(states), msg, ended)
            elif isinstance(msg, Exit):
                ended = True
        if states and states[-1].state == "queued" and (why := idle.why(clock())) and why != said:
            on_wait(why)
            said = why
        if ended:
            # The agent answers every command before it exits; give the last lines a moment.
            for msg in _settle(reader, sleep):
                if isinstance(msg, Result) and msg.id == command.id:
                    return Outcome(command, sent_t, tuple(states), msg, ended)
            return Outcome(command, sent_t, tuple(states), None, ended)
        if time.monotonic() >= deadline:
            return Outcome(command, sent_t, tuple(states), None, ended)
        sleep(POLL_S)


class _Idle:
    """Whether the run steps, and if not what the recording says it is doing instead."""

    def __init__(self, context: list[Message], sent_t: float) -> None:
        self.last_step: int | None = None
        self.since = sent_t  # unix time of the latest step seen (else of the request)
        self.after = ""  # what came after the latest step: an epoch's end, an evaluation trace
        for msg in context:
            self.see(msg)

    def see(self, msg: Message) -> None:
        if isinstance(msg, Step):
            self.last_step, self.since, self.after = msg.step, msg.t, ""
        elif isinstance(msg, Epoch) and msg.phase == "end":
            self.after = f"between epochs: epoch {msg.epoch + 1} ended (validation, callbacks)"
        elif isinstance(msg, Epoch) and msg.phase == "begin":
            self.after = f"epoch {msg.epoch + 1} began and has not stepped yet"
        elif isinstance(msg, Retrace) and msg.evaluation:
            self.after = "evaluating (its evaluation function was traced since)"

    def why(self, now: float) -> str:
        waited = now - self.since
        if waited < WAIT_HINT_S:
            return ""
        since = f"since step {self.last_step}" if self.last_step is not None else "yet"
        doing = self.after or "evaluating, saving, loading data or stalled"
        return f"waits for the next training step: none {since} for {WAIT_HINT_S:g}+ s ({doing})"


def _settle(reader: RecordingReader, sleep: Callable[[float], None]) -> list[Message]:
    out: list[Message] = []
    for _ in range(20):
        new = reader.read_new()
        out.extend(new)
        if not new:
            sleep(POLL_S)
    return out


def describe_result(result: Result) -> str:
    """The one line printed for a Result: what, where, how big, how long."""
    d = result.details
    bits = []
    if isinstance(d.get("path"), str):
        bits.append(str(d["path"]))
    if isinstance(d.get("bytes"), (int, float)):
        bits.append(units.size(float(d["bytes"])))  # type: ignore[arg-type]
    if isinstance(d.get("seconds"), (int, float)):
        bits.append(f"{float(d['seconds']):.2f} s")  # type: ignore[arg-type]
    if isinstance(d.get("step"), int):
        bits.append(f"step {d['step']}")
    if result.ok:
        return f"{result.action} done: {result.message}" + (f" [{' · '.join(bits[1:])}]" if len(bits) > 1 else "")
    return f"{result.action} failed: {result.message}"


def request(run_dir: Path, action: Action, *, timeout_s: float, steps: int | None = None,
            ms: float | None = None, logdir: str | None = None, dest_dir: str | None = None,
            out: TextIO | None = None) -> int:
    """``tpuwatch profile|checkpoint [RUN]``: sends, prints progress and the result (waiting at most
    ``timeout_s``); returns the exit code."""
    out = out or sys.stdout
    try:
        command = command_for(action, steps=steps, ms=ms, logdir=logdir, dest_dir=dest_dir)
    except ValueError as e:
        print(f"tpuwatch: {e}", file=sys.stderr)
        return EXIT_FAILED

    def on_state(s: CommandState) -> None:
        where = f" at step {s.step}" if s.step is not None else ""
        print(f"tpuwatch: {action} {s.state}{where}", file=out, flush=True)

    def on_wait(why: str) -> None:
        print(f"tpuwatch: {action} {why}", file=out, flush=True)

    try:
        outcome = send_and_wait(run_dir, command, timeout_s, on_state, on_wait=on_wait)
    except AgentUnavailable as e:
        print(f"tpuwatch: run {printable(run_dir.name)} is not live: {printable(str(e))}", file=sys.stderr)
        return EXIT_NOT_LIVE
    except KeyboardInterrupt:  # Ctrl-C on this command, not on training: the request is the run's now
        print(f"tpuwatch: {action} interrupted: stopped waiting; the run still does it if it was sent (no cancel): "
              f"its one result goes to the dashboard and `tpuwatch report {rundir.reference(run_dir)}`",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    result = outcome.result
    if result is None:
        if outcome.ended:
            print(f"tpuwatch: {action}: the run ended without its result; `tpuwatch report {rundir.reference(run_dir)}` "
                  "for the run's end", file=sys.stderr)
        else:  # no cancel: the agent still does it at the next step boundary; this command just stops waiting
            where = "still queued" if outcome.states and outcome.states[-1].state == "queued" else "not done"
            print(f"tpuwatch: {action}: no result after --timeout {timeout_s:g} s ({where}); stopped waiting, the run "
                  f"will still do it (no cancel): its result goes to the dashboard and `tpuwatch report "
                  f"{rundir.reference(run_dir)}`", file=sys.stderr)
        return EXIT_FAILED
    # The agent's message and paths are the run's text: never terminal controls.
    print(f"tpuwatch: {printable(describe_result(result))}", file=out, flush=True)
    if not result.ok:
        return EXIT_FAILED
    if action == "profile":
        _print_summary(result, out, run_dir)
    return EXIT_OK


def _print_summary(result: Result, out: TextIO, run_dir: Path) -> None:
    from tpuwatch.monitor import profile_summary

    local = result.details.get("local_path") or result.details.get("path")
    if not isinstance(local, str) or not os.path.isdir(local):
        logdir = result.details.get("logdir")
        if isinstance(logdir, str):
            print("open it with:\n  " + "\n  ".join(profile_summary.open_commands(logdir)), file=out)
        return
    try:
        summary = profile_summary.summarize(local)
    except profile_summary.ProfileSummaryError as e:
        print(f"tpuwatch: no summary: {printable(str(e))}", file=out)
        print("open it with:\n  " + "\n  ".join(profile_summary.open_commands(str(Path(local).parents[2]))), file=out)
        return
    print(printable(profile_summary.render_text(summary, live=profile_summary.recent_input_share(run_dir))),
          file=out, flush=True)

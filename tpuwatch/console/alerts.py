"""``--notify CMD``: run a command of the user's on every new warning or critical finding, a
stall, a crash and the end of the run (docs/alerts.md).

The command runs through the shell with the event as one JSON object on its stdin and its
kind, rule, severity, run id, status and a one-line message in environment variables
(``settings.EVENT_*``). Each command has a thread and a bounded queue of its own, so a slow one delays
neither the viewer, nor training, nor the other commands; one that outlives
``TPUWATCH_NOTIFY_TIMEOUT_S`` is killed (its whole process group), counted and reported.

A finding is sent once, and again only if it gets worse (warning -> critical), as the
dashboard lists it. Findings and stalls are rate-limited (a burst of :data:`RATE_BURST`, then
one every :data:`RATE_EVERY_S` seconds; the rest are counted and the end event says how many);
a crash and the end of the run are always sent.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable, Literal, Sequence

from tpuwatch import settings
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.monitor.state import finding_key
from tpuwatch.printable import one_line
from tpuwatch.protocol import SEVERITY_RANK, Finding, Message, Severity

EventKind = Literal["finding", "stall", "crash", "end"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")

#: Findings and stalls: at most this many at once, then one every RATE_EVERY_S seconds.
RATE_BURST = 5
RATE_EVERY_S = 60.0
#: Events waiting for one command beyond this many are dropped (and counted).
QUEUE_LIMIT = 100
#: What ``close`` waits for the commands still running the last events beyond their timeout.
CLOSE_SLACK_S = 2.0


@dataclass(frozen=True)
class AlertEvent:
    """What a ``--notify`` command receives (stdin: this as JSON; env: the main fields)."""

    kind: EventKind
    severity: Severity
    rule: str  # the finding's rule; "" for crash and end
    message: str
    run_id: str
    run_dir: str
    script: str
    host: str
    status: str  # the run's status when the event was made (running, stalled, crashed, finished, ...)
    step: int
    t: float  # unix time the event is about (the finding's, the run's end)
    advice: str = ""
    worker: str = ""
    exit_code: int | None = None
    suppressed: int = 0  # end only: findings and stalls not sent because of the rate limit
    #: The evidence a finding carries, for whoever is woken: what the training thread waited in
    #: (a stall's stacks, taken by the agent while it hung), where those stacks are, the
    #: profile captured by itself.
    stack_headline: str = ""
    stacks: str = ""
    profile: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def env(self) -> dict[str, str]:
        """The main fields, each one printable line: a NUL cannot be in an environment, a lone
        surrogate cannot be encoded into one, and a newline or an escape would reach a mail
        header or a terminal (the JSON on stdin keeps the text whole)."""
        return {name: one_line(value) for name, value in (
            (settings.EVENT_KIND.name, self.kind),
            (settings.EVENT_RULE.name, self.rule),
            (settings.EVENT_SEVERITY.name, self.severity),
            (settings.EVENT_RUN.name, self.run_id),
            (settings.EVENT_STATUS.name, self.status),
            (settings.EVENT_MESSAGE.name, self.summary()),
        )}

    def summary(self) -> str:
        """One line for a desktop notification or a mail subject."""
        what = {"finding": f"{self.rule} ({self.severity})", "stall": f"stalled ({self.severity})",
                "crash": "crashed", "end": self.status}[self.kind]
        text = f"tpuwatch {self.run_id or self.script}: {what} at step {self.step:,}"
        return f"{text}: {self.message}" if self.message else text


@dataclass
class CommandStats:
    command: str
    sent: int = 0
    failed: int = 0  # exited non-zero
    timed_out: int = 0  # killed after the timeout
    dropped: int = 0  # its queue was full


class NotifyCommand:
    """One ``--notify`` command: its own thread runs it once per event, in order."""

    def __init__(self, command: str, *, timeout_s: float, report: Callable[[str], None],
                 cwd: str | None = None) -> None:
        self.stats = CommandStats(command)
        self.timeout_s = timeout_s
        self.report = report
        self.cwd = cwd
        self._queue: queue.Queue[AlertEvent | None] = queue.Queue(QUEUE_LIMIT)
        self._proc: subprocess.Popen[bytes] | None = None
        self._killed = False  # the running command was killed (timeout, or close)
        self._closed = False  # close() ran out of time: no command starts any more
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name="tpuwatch-notify", daemon=True)
        self._thread.start()

    def submit(self, event: AlertEvent) -> None:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.stats.dropped += 1

    def close(self, timeout_s: float) -> None:
        """Lets the queued events go out for at most ``timeout_s``; then kills what still runs."""
        try:
            self._queue.put(None, timeout=max(0.0, timeout_s))
        except queue.Full:
            pass
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            with self._lock:  # nothing starts from here on: a command started after this kill
                self._closed = True  # (in a session of its own) would outlive tpuwatch
            self._kill()
            self._thread.join(CLOSE_SLACK_S)  # it counts the kill
            while True:  # what was still queued is dropped, counted
                try:
                    if self._queue.get_nowait() is not None:
                        self.stats.dropped += 1
                except queue.Empty:
                    break

    def _kill(self) -> None:
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            self._killed = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _work(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            with self._lock:
                closed = self._closed
            if closed:
                self.stats.dropped += 1
                continue
            try:
                self._run(event)
            except Exception as e:  # one event that cannot be sent must not silence the ones after it
                self.stats.failed += 1
                self.report(f"notify `{self.stats.command}`: cannot send the {event.kind} event "
                            f"({type(e).__name__}: {e})")

    def _run(self, event: AlertEvent) -> None:
        env = dict(os.environ)
        env.update(event.env())
        name = f"notify `{self.stats.command}`"
        try:
            # A session of its own: a timeout kills the shell and everything it started.
            proc = subprocess.Popen(self.stats.command, shell=True, stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=self.cwd,
                                    start_new_session=True)
        except OSError as e:
            self.stats.failed += 1
            self.report(f"{name}: cannot start it ({e.strerror or e})")
            return
        with self._lock:
            self._proc, self._killed = proc, False
            closed = self._closed
        if closed:  # close() gave up on the queue while this one started
            self._kill()
        try:
            _, err = proc.communicate((event.to_json() + "\n").encode(), timeout=self.timeout_s)
            if self._killed:
                raise subprocess.TimeoutExpired(self.stats.command, self.timeout_s)
        except subprocess.TimeoutExpired:
            self._kill()
            proc.communicate()
            self.stats.timed_out += 1
            self.report(f"{name} ran past {self.timeout_s:g} s ({event.kind} event): killed "
                        f"({self.stats.timed_out} so far; TPUWATCH_NOTIFY_TIMEOUT_S sets the limit)")
            return
        finally:
            with self._lock:
                self._proc = None
        if proc.returncode != 0:
            self.stats.failed += 1
            why = err.decode(errors="replace").strip().splitlines()
            self.report(f"{name} exited {proc.returncode} ({event.kind} event)"
                        + (f": {why[-1][:200]}" if why else ""))
            return
        self.stats.sent += 1


class Alerts:
    """The ``--notify`` outlet of a :class:`~tpuwatch.console.relay.Relay`: events from the run,
    deduplicated and rate-limited, to every command.

    ``run_dir``: where the run is recorded (in the events; the commands run there). ``report``:
    where a failing or slow command is said (one line each).
    """

    def __init__(self, commands: Sequence[str], *, min_severity: Severity = "warning",
                 report: Callable[[str], None], run_dir: str = "", timeout_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.min_rank = SEVERITY_RANK[min_severity]
        self.run_dir = run_dir
        self.clock = clock
        timeout = settings.NOTIFY_TIMEOUT_S.positive_float() if timeout_s is None else timeout_s
        self.timeout_s = timeout
        self.commands = [NotifyCommand(c, timeout_s=timeout, report=report) for c in commands]
        self.events: list[AlertEvent] = []  # every event sent, in order
        self.suppressed = 0
        self._sent: dict[tuple[str, str, str], int] = {}  # finding key -> severity rank sent
        self._crash_sent = False
        self._tokens = float(RATE_BURST)
        self._tokens_t = clock()

    # --- Outlet ----------------------------------------------------------------------------------

    def take(self, worker: str, msg: Message) -> None:
        pass

    def update(self, snap: RunSnapshot, new_findings: Sequence[Finding]) -> None:
        for f in new_findings:
            self._finding(snap, f)
        if snap.status == "crashed":
            self._crash(snap)

    def close(self, snap: RunSnapshot, new_findings: Sequence[Finding]) -> None:
        self.update(snap, new_findings)
        if snap.status in ("finished", "stopped", "crashed", "lost"):
            severity: Severity = ("info" if snap.status == "finished" else
                                  "warning" if snap.status == "stopped" else "critical")
            message = f"exit code {snap.exit_code}" if snap.exit_code is not None else (snap.lost_reason or "")
            self._send(self._event(snap, "end", severity, "", message, t=snap.ended_t or snap.now,
                                   exit_code=snap.exit_code, suppressed=self.suppressed), limited=False)
        deadline = time.monotonic() + self.timeout_s + CLOSE_SLACK_S
        for c in self.commands:
            c.close(max(0.0, deadline - time.monotonic()))

    # --- events ------------------------------------------------------------------------------------

    def _event(self, snap: RunSnapshot, kind: EventKind, severity: Severity, rule: str, message: str, *,
               t: float, advice: str = "", worker: str = "", exit_code: int | None = None,
               suppressed: int = 0) -> AlertEvent:
        return AlertEvent(kind=kind, severity=severity, rule=rule, message=message, run_id=snap.run_id,
                          run_dir=self.run_dir, script=snap.script, host=snap.host, status=snap.status,
                          step=snap.step, t=t, advice=advice, worker=worker, exit_code=exit_code,
                          suppressed=suppressed)

    def _finding(self, snap: RunSnapshot, f: Finding) -> None:
        rank = SEVERITY_RANK.get(f.severity, 0)
        key = finding_key(f)
        if rank < self.min_rank or rank <= self._sent.get(key, -1):
            return
        self._sent[key] = rank
        kind: EventKind = "stall" if f.rule == "stall" else "finding"
        event = self._event(snap, kind, f.severity, f.rule, f.message, t=f.t, advice=f.advice, worker=f.worker)
        headline, stacks, profile = (str(f.evidence.get(k, "")) for k in ("waiting_at", "stacks", "profile_path"))
        if headline or stacks or profile:
            event = replace(event, stack_headline=headline, stacks=stacks, profile=profile)
        self._send(event)

    def _crash(self, snap: RunSnapshot) -> None:
        if self._crash_sent:
            return
        self._crash_sent = True
        message = snap.exception or (f"exit code {snap.exit_code}" if snap.exit_code is not None else "")
        self._send(self._event(snap, "crash", "critical", "", message, t=snap.ended_t or snap.now,
                               exit_code=snap.exit_code), limited=False)

    def _send(self, event: AlertEvent, limited: bool = True) -> None:
        if limited:
            now = self.clock()
            self._tokens = min(float(RATE_BURST), self._tokens + (now - self._tokens_t) / RATE_EVERY_S)
            self._tokens_t = now
            if self._tokens < 1.0:
                self.suppressed += 1
                return
            self._tokens -= 1.0
        self.events.append(event)
        for c in self.commands:
            c.submit(event)

    def summary(self) -> str:
        """One line: what was sent, and each command's trouble."""
        parts = [f"{len(self.events)} event(s) to {len(self.commands)} command(s)"]
        if self.suppressed:
            parts.append(f"{self.suppressed} held back by the rate limit")
        for c in self.commands:
            s = c.stats
            trouble = [f"{n} {what}" for n, what in ((s.timed_out, "timed out (killed)"),
                                                     (s.failed, "failed"), (s.dropped, "dropped"))
                       if n]
            if trouble:
                parts.append(f"`{s.command}`: " + ", ".join(trouble))
        return "notify: " + "; ".join(parts)

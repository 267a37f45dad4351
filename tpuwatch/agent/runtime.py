"""The agent's core: the message buffer, the writer thread, probes that fail once, safe points.

The training thread only ever appends to an in-memory deque (``Agent.emit``); a daemon thread
encodes, appends to ``events.jsonl`` and flushes at the sample rate, and runs the periodic
samplers. Nothing here blocks the training thread on I/O, and nothing raises into user code:
a probe that fails is disabled and reported once (``Agent.probe_failed``).
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeAlias

from tpuwatch import protocol, rundir, settings
from tpuwatch.agent import clocks
from tpuwatch.agent.agent_api import CommandRefused, Handler, OutputLoss, Sampler, high_fd
from tpuwatch.protocol import Command, CommandState, Event, Level, Message, Result

if TYPE_CHECKING:
    from tpuwatch.agent.pipeline_map import PipelineMap
    from tpuwatch.agent.profiler import Profiler
    from tpuwatch.agent.retraces import RetraceProbe
    from tpuwatch.agent.steps import StepProbe
    from tpuwatch.agent.transport import Server

#: What the buffer holds: a message, or a Step as its fields in declaration order (emit_step).
Buffered: TypeAlias = "Message | tuple[Any, ...]"

_current: "Agent | None" = None
_WRITE_CHUNK = 1 << 20
#: The writer gives up the GIL after encoding this many messages: a drain of a few hundred Steps
#: holds it for milliseconds otherwise, and a training thread coming back from TensorFlow waits
#: for it (up to the interpreter's 5 ms switch interval) before its next step can start.
_YIELD_EVERY = 32
#: Messages held in memory for the agent's thread to write at most; past it (a starved or stuck
#: agent thread) they are dropped and counted, so the training thread's memory never grows.
MAX_BUFFERED = 200_000


def current() -> "Agent | None":
    """The agent of this process, if one is running."""
    return _current


class Agent:
    def __init__(
        self,
        run_dir: Path,
        run_id: str,
        sample_hz: float = 4.0,
        clock: Callable[[], float] = clocks.wall,
    ) -> None:
        self.run_dir = Path(os.path.abspath(run_dir))  # a script that chdirs must not move it
        run_dir = self.run_dir
        self.run_id = run_id
        self.sample_interval_s = 1.0 / max(0.5, min(sample_hz, 20.0))
        self.clock = clock
        self._buf: collections.deque[Buffered] = collections.deque()
        self._spilled = 0  # messages dropped because the buffer was full (said by _drain)
        self._samplers: list[tuple[str, Sampler]] = []
        self._disabled: dict[str, str] = {}
        self._handlers: dict[str, tuple[Handler, bool, Callable[[Command], None] | None]] = {}
        self._pending: collections.deque[Command] = collections.deque()
        self._shutdown_hooks: list[Callable[[], None]] = []
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by stop() and flush(): the writer drains now
        self._flushed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._events_path = run_dir / rundir.EVENTS
        # Whole lines per write(2) with O_APPEND: the launcher appends findings to the same file,
        # and appends of whole lines never interleave mid-line.
        # Never through a planted link, nor into a file that is not this user's own (rundir); on a
        # high descriptor, so a script that closes and reopens low ones never gets the stream.
        self._fd = high_fd(rundir.open_append(self._events_path))
        self._fd_identity = _identity(self._fd)
        self.global_step = 0
        # Full-disk accounting (see _write): what was dropped since the last note.
        self._cut = False
        self._lost_messages = 0
        self._lost_bytes = 0
        self._disk_full_since: float | None = None
        self._output_lost_reported = 0
        self._output_seen = 0
        self.output_guard: OutputLoss | None = None  # set by guards.install
        # Fault injection for tests: the named probe raises the first time it does its work.
        self._fault = settings.TEST_FAIL_PROBE.get()
        self.server: Server | None = None  # set by the runner
        self.forked = False  # True in a child made by fork(): the agent is the parent's
        self.step_probe: StepProbe | None = None  # set by probes.install_all
        self.retrace_probe: RetraceProbe | None = None  # set by probes.install_all (the leak doctor reads it)
        self.pipeline_map: PipelineMap | None = None  # set by probes.install_tf_probes (the leak doctor reads it)
        self.profiler: Profiler | None = None  # set by probes.install_tf_probes (the auto-profile captures through it)
        self.num_workers = 1  # of the strategy announced last (environment)
        # Called on the agent thread with the Steps' fields written by one drain, in order (never
        # on the training thread); a tap that raises is dropped with its probe (its name, the tap).
        self.step_taps: list[tuple[str, Callable[[list[tuple[Any, ...]]], None]]] = []
        # Command id -> called with (ok, message, details) when its Result is sent.
        self._on_result: dict[str, Callable[[bool, str, dict[str, Any]], None]] = {}
        from tpuwatch.agent.phases import PhaseTracker

        self.phases = PhaseTracker(self)  # what the process is doing (no TensorFlow needed)

    def manual_step_probe(self) -> StepProbe:
        """The step probe, made now if TensorFlow was never imported (``tpuwatch.step`` needs none)."""
        if self.step_probe is None:
            from tpuwatch.agent.steps import StepProbe

            self.step_probe = StepProbe(self)
        return self.step_probe

    # --- producing messages (any thread, never blocks) --------------------------------------

    def emit(self, msg: Message, force: bool = False) -> None:
        """``force``: kept past the bound (the run's exception and exit are never dropped)."""
        buf = self._buf
        if force or len(buf) < MAX_BUFFERED:
            buf.append(msg)
        else:
            self._spilled += 1

    def emit_step(self, fields: tuple[Any, ...]) -> None:
        """A Step given as its fields in declaration order; built on the agent's thread."""
        buf = self._buf
        if len(buf) < MAX_BUFFERED:
            buf.append(fields)
        else:
            self._spilled += 1

    def event(self, level: Level, source: str, message: str, *, fact: str = "", subject: str = "",
              reason: str = "") -> None:
        """One event; ``fact`` (a ``protocol.EventFact``) with its subject and reason is what a
        viewer acts on, ``message`` what a person reads."""
        self.emit(Event(t=self.clock(), level=level, source=source, message=message, fact=fact, subject=subject,
                        reason=reason))

    def probe_failed(self, probe: str, exc: BaseException | str) -> None:
        """Disables ``probe`` and records one warning. Safe to call repeatedly."""
        if probe in self._disabled:
            return
        reason = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        reason = reason.splitlines()[0][:300] if reason else "unknown error"
        self._disabled[probe] = reason
        self.event("warning", f"probe:{probe}", f"probe {probe} disabled: {reason}",
                   fact=protocol.EventFact.PROBE_DISABLED, subject=probe, reason=reason)

    def inject_fault(self, probe: str) -> None:
        if self._fault == probe:
            raise RuntimeError(f"fault injected into probe {probe} (TPUWATCH_TEST_FAIL_PROBE)")

    def enabled(self, probe: str) -> bool:
        return probe not in self._disabled

    @property
    def disabled_probes(self) -> dict[str, str]:
        return dict(self._disabled)

    def add_sampler(self, name: str, sampler: Sampler) -> None:
        """``sampler`` runs on the agent thread at the sample rate; it fails once, then stops."""
        self._samplers.append((name, sampler))

    # --- commands ---------------------------------------------------------------------------

    def register(
        self,
        action: str,
        handler: Handler,
        *,
        at_step_boundary: bool = True,
        validate: Callable[[Command], None] | None = None,
    ) -> None:
        """Registers a command handler. ``validate`` runs on receipt and may raise CommandRefused."""
        self._handlers[action] = (handler, at_step_boundary, validate)

    def submit(self, cmd: Command,
               on_result: Callable[[bool, str, dict[str, Any]], None] | None = None) -> None:
        """Called by the transport when a viewer sends a command (any thread), or by the agent
        itself (the auto-profile); ``on_result`` is called with its Result's ok, message, details."""
        if on_result is not None:
            self._on_result[cmd.id] = on_result
        entry = self._handlers.get(cmd.action)
        if entry is None:
            known = ", ".join(sorted(self._handlers)) or "none"
            self._result(cmd, False, f"unknown action {cmd.action!r} (known: {known})")
            return
        handler, at_boundary, validate = entry
        try:
            if validate is not None:
                validate(cmd)
        except CommandRefused as e:
            self._result(cmd, False, str(e))
            return
        except Exception as e:  # a validator bug must not kill the server thread
            self._result(cmd, False, f"could not validate {cmd.action}: {type(e).__name__}: {e}")
            return
        with self._lock:
            if cmd.action in self._busy:
                self._result(cmd, False, f"a {cmd.action} is already queued or running; wait for its result")
                return
            self._busy.add(cmd.action)
        if at_boundary:
            self.emit(CommandState(t=self.clock(), id=cmd.id, action=cmd.action, state="queued", step=self.global_step))
            self._pending.append(cmd)
        else:
            self._execute(cmd, handler)

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def safe_point(self) -> None:
        """Runs queued commands. Called on the training thread between two steps."""
        while self._pending:
            try:
                cmd = self._pending.popleft()
            except IndexError:
                return
            self._execute(cmd, self._handlers[cmd.action][0])

    def _execute(self, cmd: Command, handler: Handler) -> None:
        self.emit(CommandState(t=self.clock(), id=cmd.id, action=cmd.action, state="running", step=self.global_step))
        try:
            message, details = handler(cmd)
            ok = True
        except CommandRefused as e:
            message, details, ok = str(e), {}, False
        except Exception as e:  # a handler's bug fails its command, never the training step that ran it
            first = str(e).splitlines()[0] if str(e) else ""
            message, details, ok = f"{cmd.action} failed: {type(e).__name__}: {first}", {}, False
        except BaseException as e:  # Ctrl-C (or SystemExit) on the training thread mid-command: it goes
            # on to the script as it would without tpuwatch; the command still gets its one Result
            self.finish(cmd, False, f"{cmd.action} interrupted by {type(e).__name__} on the training thread; "
                                    "nothing was kept")
            raise
        # A handler may finish asynchronously (a profile spans steps): it then returns None.
        if message is not None:
            self.finish(cmd, ok, message, details)

    def finish(self, cmd: Command, ok: bool, message: str, details: dict[str, Any] | None = None) -> None:
        """Sends the one Result for ``cmd`` and frees its action."""
        with self._lock:
            self._busy.discard(cmd.action)
        self._result(cmd, ok, message, details or {})

    def _result(self, cmd: Command, ok: bool, message: str, details: dict[str, Any] | None = None) -> None:
        plain = {k: v for k, v in (details or {}).items() if v is None or isinstance(v, (int, float, str, bool))}
        self.emit(Result(t=self.clock(), id=cmd.id, action=cmd.action, ok=ok, message=message, details=plain))
        listener = self._on_result.pop(cmd.id, None)
        if listener is not None:
            try:
                listener(ok, message, plain)
            except Exception as e:  # the listener's probe stops; the command has its Result
                self.probe_failed(getattr(listener, "probe", "agent"), e)

    def fail_pending(self, reason: str) -> None:
        while self._pending:
            cmd = self._pending.popleft()
            self.finish(cmd, False, reason)

    def on_shutdown(self, hook: Callable[[], None]) -> None:
        """``hook`` runs once the script has returned, while the recording is still open (to end
        a capture still running, wait for uploads, ...)."""
        self._shutdown_hooks.append(hook)

    def detach_after_fork(self) -> None:
        """In a forked child (guards.install registers it): from now on this agent records
        nothing and its end touches neither the parent's socket nor its recording."""
        self.forked = True
        self._buf = collections.deque(maxlen=0)  # emit() stays one append, into nothing
        self._pending = collections.deque(maxlen=0)
        self._shutdown_hooks = []
        server, self.server = self.server, None
        if server is not None:
            server.detach_after_fork()
        try:
            os.close(self._fd)
        except OSError:
            pass
        self._fd = -1

    def shutdown(self, reason: str) -> None:
        """The script has ended: fails queued commands, runs the shutdown hooks. Never raises."""
        if self.forked:
            return
        self.fail_pending(reason)
        for hook in self._shutdown_hooks:
            try:
                hook()
            except Exception as e:  # one hook's failure must not skip the others nor the exit record
                self.event("error", "agent", f"shutdown hook {getattr(hook, '__qualname__', hook)} failed: "
                                             f"{type(e).__name__}: {e}")

    # --- the agent thread -------------------------------------------------------------------

    def start(self) -> None:
        global _current
        _current = self
        self._thread = threading.Thread(target=self._loop, name="tpuwatch-agent", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        next_sample = 0.0
        while not self._stop.is_set():
            now = clocks.monotonic()
            if now >= next_sample:
                self._sample()
                next_sample = now + self.sample_interval_s
            self._drain()
            # One drain a sample period, at least one a second (each is a write(2) and a
            # descriptor check, ~90 µs here, which at 10 a second cost a tiny step 5 µs of the
            # agent thread's CPU), or at once when flush() or stop() asks.
            self._wake.wait(min(self.sample_interval_s, 1.0))
            self._wake.clear()
        self._drain()

    def _sample(self) -> None:
        for name, sampler in self._samplers:
            if name in self._disabled:
                continue
            try:
                for msg in sampler():
                    self._buf.append(msg)
            except Exception as e:  # a sampler's bug stops that sampler (said once), not the agent thread
                self.probe_failed(name, e)

    def _drain(self) -> None:
        buf = self._buf
        if not buf:
            return
        lines: list[bytes] = []
        steps: list[tuple[Any, ...]] = []  # the Steps' fields, for the taps (one call a drain)
        size = 0
        final = False
        encode, encode_step, popleft = protocol.encode, protocol.encode_step_values, buf.popleft
        while buf:
            try:
                item = popleft()
            except IndexError:
                break
            try:
                if isinstance(item, tuple):  # a Step's fields (emit_step): messages are dataclasses
                    line = encode_step(item)
                    steps.append(item)
                else:
                    line = encode(item)
                    final = final or item.kind == "exit"
            except Exception as e:  # a bad value must never stop the recording
                kind = "step" if type(item) is tuple else getattr(item, "kind", "?")
                line = encode(Event(t=self.clock(), level="error", source="agent",
                                    message=f"could not encode {kind}: {e}"))
            lines.append(line)
            size += len(line)
            if not len(lines) % _YIELD_EVERY:
                time.sleep(0)  # lets a training thread that waits for the GIL have it (see _YIELD_EVERY)
            if size >= _WRITE_CHUNK:
                self._tap(steps)
                steps = []
                self._write(b"".join(lines))
                lines, size = [], 0
        self._tap(steps)
        spilled = self._spilled
        if spilled:
            self._spilled -= spilled
            lines.insert(0, protocol.encode(Event(  # before an exit record, if this drain has one
                t=self.clock(), level="warning", source="agent",
                message=f"the agent's writer fell behind: {spilled} messages dropped (its buffer holds "
                        f"{MAX_BUFFERED:,}); the figures around here miss them")))
        if lines:
            self._write(b"".join(lines), final)
        with self._flushed:
            self._flushed.notify_all()

    def _tap(self, steps: list[tuple[Any, ...]]) -> None:
        if not steps:
            return
        for name, tap in list(self.step_taps):
            if name in self._disabled:
                continue
            try:
                tap(steps)
            except Exception as e:  # that probe stops, the recording goes on
                self.step_taps.remove((name, tap))
                self.probe_failed(name, e)

    def _write(self, data: bytes, final: bool = False) -> None:
        """Appends whole lines. On a full disk the lines are dropped and counted (never retried
        from memory: the training must not grow); the next write that fits starts with a note of
        what was lost. ``final``: the exit record is in ``data``, so the run directory's disk
        reserve is given up for it if that is what it takes."""
        if "recording" in self._disabled:
            return
        note = self._loss_note(final)
        if note:
            data = note + data
        written = self._write_all(data)
        if written < 0 and final and rundir.release_reserve(self.run_dir):
            written = self._write_all(data)
        if written >= 0:
            self._disk_full_since = None
            self._lost_messages = self._lost_bytes = 0
            if note:
                self._output_lost_reported = self._output_seen
            return
        lost = data.count(b"\n") - (note.count(b"\n") if note else 0)
        self._lost_messages += lost
        self._lost_bytes += len(data) - len(note)
        if self._disk_full_since is None:
            self._disk_full_since = self.clock()

    def _check_fd(self) -> None:
        """A script can close the recording's descriptor and open its own file on the same number
        (``os.closerange``, ``dup2``): before each write (a batch, on the agent's thread, one
        ``fstat``) the descriptor must still be the file the agent opened; if not, it is left to
        the script and the recording is opened again."""
        if _identity(self._fd) == self._fd_identity:
            return
        old = self._fd
        try:
            self._fd = high_fd(rundir.open_append(self._events_path, create=False))
        except OSError as e:
            self._fd = -1
            self._disabled["recording"] = str(e)
            return
        self._fd_identity = _identity(self._fd)
        self._cut = False  # the cut line, if any, is not ours to end any more
        self._buf.appendleft(Event(t=self.clock(), level="warning", source="agent",
                                   message=f"the script closed or reused the recording's descriptor {old}; "
                                           "tpuwatch opened events.jsonl again (nothing was written into the "
                                           "script's file)"))

    def _write_all(self, data: bytes) -> int:
        """Writes ``data``; the byte count, or -1 when the disk is full. A write the disk cut
        short is taken back (truncated off) so the recording never holds half a line; if even
        that fails, the next write first ends the cut line."""
        self._check_fd()
        if "recording" in self._disabled:
            return 0
        if self._cut:
            data = b"\n" + data
        view = memoryview(data)
        written = 0
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
                written += n
        except OSError as e:
            if e.errno in rundir.DISK_FULL_ERRNOS:
                if written:
                    try:  # O_APPEND: our bytes are the file's last ones (the file is as before)
                        os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
                    except OSError:
                        self._cut = True
                return -1
            # Anything else (the file system gone, ...): say so once on stderr and stop recording.
            self._disabled["recording"] = str(e)
            print(f"tpuwatch: cannot write {self._events_path}: {e}; the recording stops here", file=sys.stderr)
            return 0
        self._cut = False
        return len(data)

    def _output_guard_lost(self) -> int:
        guard = self.output_guard
        return guard.dropped_bytes if guard is not None else 0

    def _loss_note(self, final: bool) -> bytes:
        """The event saying what a full disk made the run lose since the last note ("" if nothing).
        Output still being dropped waits for the next note (one note per full-disk episode, not
        one per write), unless this is the last write."""
        total = self._output_guard_lost()
        settling, self._output_seen = total != self._output_seen, total
        output = total - self._output_lost_reported
        if settling and not final and not self._lost_messages:
            output = 0
        if not self._lost_messages and not output:
            return b""
        since = self._disk_full_since
        if since is None and self.output_guard is not None:
            since = self.output_guard.first_drop_t
        parts = []
        if self._lost_messages:
            parts.append(f"{self._lost_messages:,} recorded message(s) ({self._lost_bytes:,} bytes)")
        if output:
            parts.append(f"{output:,} bytes of the script's output")
        span = f" from {time.strftime('%H:%M:%S', time.localtime(since))}" if since else ""
        return protocol.encode(Event(
            t=self.clock(), level="warning", source=protocol.DISK_FULL_SOURCE,
            message=f"the disk was full{span}: lost {' and '.join(parts)}; training went on"))

    @property
    def events_path(self) -> Path:
        return self._events_path

    def flush(self, timeout: float = 2.0) -> None:
        """Waits until everything emitted so far is on disk (used at exit)."""
        if self._thread is None or not self._thread.is_alive():
            self._drain()
            return
        deadline = clocks.monotonic() + timeout
        self._wake.set()
        with self._flushed:
            while self._buf and clocks.monotonic() < deadline:
                self._flushed.wait(0.05)

    def stop(self) -> None:
        global _current
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._drain()
        try:
            os.close(self._fd)
        except OSError:
            pass
        self.release_reserve()
        if self.server is not None:
            self.server.close()
        if _current is self:
            _current = None

    def release_reserve(self) -> None:
        if not self.forked and not settings.RUN_ID.get():
            # Started on its own: no launcher comes after us to use the disk reserve.
            rundir.release_reserve(self.run_dir)

    def before_signal_death(self) -> None:
        """The process is about to die by a signal (guards): remove what would be left stale."""
        server = self.server
        if server is not None and server.unix_path is not None:
            try:
                server.unix_path.unlink()
            except OSError:
                pass
        self.release_reserve()


def _identity(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def format_exception(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


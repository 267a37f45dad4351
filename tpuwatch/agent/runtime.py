"""The agent's core: the message buffer, the agent's thread, probes that fail once, safe points.

The training thread only ever appends to an in-memory deque (``Agent.emit``); a daemon thread
encodes it and hands the lines to the recording's writer (``recording_writer.RecordingWriter``)
at the sample rate, and runs the periodic samplers (``sampler_set.SamplerSet``). Commands wait in
``command_queue.CommandQueue`` for the training thread's next safe point. The Agent wires the
three. Nothing here blocks the training thread on I/O, and nothing raises into user code: a
probe that fails is disabled and reported once (``Agent.probe_failed``).
"""

from __future__ import annotations

import collections
import os
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeAlias

from tpuwatch import protocol, rundir, settings
from tpuwatch.agent import clocks
from tpuwatch.agent.agent_api import Handler, OutputLoss, ResultListener, Sampler
from tpuwatch.agent.command_queue import CommandQueue
from tpuwatch.agent.recording_writer import RecordingWriter
from tpuwatch.agent.sampler_set import SamplerSet
from tpuwatch.protocol import Command, Event, Level, Message

if TYPE_CHECKING:
    from tpuwatch.agent.leak_doctor import LeakDoctor
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
        self._disabled: dict[str, str] = {}  # shared with the writer, the samplers (and the step probe)
        self.samplers = SamplerSet(self._disabled, self.probe_failed)
        self.commands = CommandQueue(self.emit, self.clock, lambda: self.global_step, self.probe_failed)
        self._shutdown_hooks: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by stop() and flush(): the writer drains now
        self._flushed = threading.Condition()
        self._thread: threading.Thread | None = None
        self.writer = RecordingWriter(run_dir, self.clock, self._disabled, lambda m: self._buf.appendleft(m))
        self.global_step = 0
        # Fault injection for tests: the named probe raises the first time it does its work.
        self._fault = settings.TEST_FAIL_PROBE.get()
        self.server: Server | None = None  # set by the runner
        self.forked = False  # True in a child made by fork(): the agent is the parent's
        self.step_probe: StepProbe | None = None  # set by probes.install_all
        self.retrace_probe: RetraceProbe | None = None  # set by probes.install_all (the leak doctor reads it)
        self.pipeline_map: PipelineMap | None = None  # set by probes.install_tf_probes (the leak doctor reads it)
        self.leak_doctor: LeakDoctor | None = None  # set by probes.install_tf_probes (the auto-profile reads it)
        self.profiler: Profiler | None = None  # set by probes.install_tf_probes (the auto-profile captures through it)
        self.num_workers = 1  # of the strategy announced last (environment)
        # Called on the agent thread with the Steps' fields written by one drain, in order (never
        # on the training thread); a tap that raises is dropped with its probe (its name, the tap).
        self.step_taps: list[tuple[str, Callable[[list[tuple[Any, ...]]], None]]] = []
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

    def add_sampler(self, name: str, sampler: Sampler, every_s: float | Callable[[], float] | None = None) -> None:
        """``sampler`` runs on the agent thread at the sample rate, or every ``every_s`` seconds
        (a function: asked after each call); it fails once, then stops."""
        self.samplers.add(name, sampler, every_s)

    @property
    def output_guard(self) -> OutputLoss | None:
        """The script's output guard (set by guards.install): what a full disk dropped of the
        output, said in the recording's notes."""
        return self.writer.output_guard

    @output_guard.setter
    def output_guard(self, guard: OutputLoss | None) -> None:
        self.writer.output_guard = guard

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
        self.commands.register(action, handler, at_step_boundary=at_step_boundary, validate=validate)

    def submit(self, cmd: Command, on_result: ResultListener | None = None) -> None:
        """Called by the transport when a viewer sends a command (any thread), or by the agent
        itself (the auto-profile); ``on_result`` is called with its Result's ok, message, details."""
        self.commands.submit(cmd, on_result)

    @property
    def _pending(self) -> collections.deque[Command]:
        """The commands waiting for a safe point (the step probe checks it once a call)."""
        return self.commands.pending

    @property
    def has_pending(self) -> bool:
        return bool(self.commands.pending)

    def safe_point(self) -> None:
        """Runs queued commands. Called on the training thread between two steps."""
        self.commands.safe_point()

    def finish(self, cmd: Command, ok: bool, message: str, details: dict[str, Any] | None = None) -> None:
        """Sends the one Result for ``cmd`` and frees its action."""
        self.commands.finish(cmd, ok, message, details)

    def fail_pending(self, reason: str) -> None:
        self.commands.fail_pending(reason)

    def on_shutdown(self, hook: Callable[[], None]) -> None:
        """``hook`` runs once the script has returned, while the recording is still open (to end
        a capture still running, wait for uploads, ...)."""
        self._shutdown_hooks.append(hook)

    def detach_after_fork(self) -> None:
        """In a forked child (guards.install registers it): from now on this agent records
        nothing and its end touches neither the parent's socket nor its recording."""
        self.forked = True
        self._buf = collections.deque(maxlen=0)  # emit() stays one append, into nothing
        self.commands.detach()
        self._shutdown_hooks = []
        server, self.server = self.server, None
        if server is not None:
            server.detach_after_fork()
        self.writer.detach()

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
        next_sample = next_drain = 0.0
        drain_every = min(self.sample_interval_s, 1.0)
        woke = False
        while not self._stop.is_set():
            now = clocks.monotonic()
            if now >= next_sample:
                self._sample()
                next_sample = now + self.sample_interval_s
            next_fast = self.samplers.sample_fast(now, self._buf.append)
            # One drain a sample period, at least one a second (each is a write(2) and a
            # descriptor check, ~90 µs here, which at 10 a second cost a tiny step 5 µs of the
            # agent thread's CPU), or at once when flush() or stop() asks; never one for each
            # look of a faster sampler.
            if woke or now >= next_drain:
                self._drain()
                next_drain = now + drain_every
            woke = self._wake.wait(max(0.0, min(next_sample, next_fast, next_drain) - clocks.monotonic()))
            if woke:  # a flush() asked after a timed-out wait stays asked until the next pass drains
                self._wake.clear()
        self._drain()

    def _sample(self) -> None:
        self.samplers.sample(self._buf.append)

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
                self.writer.write(b"".join(lines))
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
            self.writer.write(b"".join(lines), final)
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

    @property
    def events_path(self) -> Path:
        return self.writer.events_path

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
        self.writer.close()
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


def format_exception(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


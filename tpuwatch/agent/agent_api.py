"""The agent as its probes see it: what a probe may call, and the few helpers they share.

The probes (every module of ``tpuwatch.agent`` but ``runtime``, which implements this, and the
wiring in ``probes`` and ``__main__``) type their agent as :class:`Agent` below and never import
``runtime``: the agent's core depends on its probes (it starts them and holds some of them),
never the other way round. This module imports nothing of the agent's; the parts of one probe
that another reaches through the agent (the phase tracker, the step probe, the output guard) are
seen through the small protocols here, so no probe's module is needed to name them. A contract in
``pyproject.toml`` and ``tests/architecture/test_no_import_cycles.py`` keep it so.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Protocol

from tpuwatch.protocol import Command, Level, Message, Phase

#: A sampler runs on the agent thread at the sample rate and returns the messages to record.
Sampler = Callable[[], Iterable[Message]]
# A command handler runs on the training thread at a step boundary (or on the server thread for
# "anytime" handlers) and returns (message, details) for an ok Result, or raises to fail it; a
# handler that finishes later (a profile spans steps) returns (None, {}) and calls Agent.finish.
Handler = Callable[[Command], "tuple[str | None, dict[str, Any]]"]
#: Called with a command's Result (ok, message, details) when it is sent.
ResultListener = Callable[[bool, str, "dict[str, Any]"], None]


class CommandRefused(Exception):
    """Raised by a handler (or its validator) to refuse a command with a one-line reason."""


class Phases(Protocol):
    """The phase tracker (``phases.PhaseTracker``), as the probes drive it."""

    enabled: bool
    since: float
    current: str
    pending: int

    def start(self, since: float) -> None: ...
    def enter(self, phase: str, detail: str = "", t: float | None = None) -> None: ...
    def during(self, phase: str, detail: str) -> ContextManager[None]: ...
    def begin(self, phase: str, detail: str) -> None: ...
    def end(self) -> None: ...
    def on_step(self, name: str, start_t: float) -> None: ...
    def other_call(self, name: str, start_perf: float) -> None: ...
    def finishing(self) -> None: ...
    def sample(self) -> list[Phase]: ...


class StepView(Protocol):
    """The step probe (``steps.StepProbe``), as the other probes reach it through the agent."""

    #: Entered around each step while set (a profile capture's step markers).
    step_context: Callable[[int], ContextManager[Any]] | None
    #: What each tf.function's trace did (``trace_flags.TraceFlags``); its ``current_top`` is the
    #: top-level call under way, if any (the gap sampler reads it, never writes it).
    trace: Any

    @property
    def last_loss(self) -> tuple[int, float, int] | None: ...
    def read_unread_losses(self) -> None: ...


class OutputLoss(Protocol):
    """What the output guard (``guards.OutputGuard``) tells the writer about output it dropped."""

    @property
    def dropped_bytes(self) -> int: ...
    @property
    def first_drop_t(self) -> float | None: ...


class Agent(Protocol):
    """The agent of this process (``runtime.Agent``), as a probe uses it."""

    run_dir: Path
    run_id: str
    clock: Callable[[], float]
    sample_interval_s: float
    global_step: int
    num_workers: int
    forked: bool
    output_guard: OutputLoss | None
    #: Called on the agent thread with the Steps' fields one drain writes (never on the training
    #: thread); a tap that raises is dropped with its probe.
    step_taps: list[tuple[str, Callable[[list[tuple[Any, ...]]], None]]]
    _disabled: dict[str, str]

    @property
    def _pending(self) -> collections.deque[Command]: ...  # commands waiting for a safe point
    @property
    def phases(self) -> Phases: ...
    @property
    def step_probe(self) -> StepView | None: ...
    @property
    def profiler(self) -> object: ...
    @property
    def events_path(self) -> Path: ...
    @property
    def has_pending(self) -> bool: ...
    @property
    def disabled_probes(self) -> dict[str, str]: ...

    def emit(self, msg: Message, force: bool = False) -> None: ...
    def emit_step(self, fields: tuple[Any, ...]) -> None: ...
    def event(self, level: Level, source: str, message: str, *, fact: str = "", subject: str = "",
              reason: str = "") -> None: ...
    def probe_failed(self, probe: str, exc: BaseException | str) -> None: ...
    def inject_fault(self, probe: str) -> None: ...
    def enabled(self, probe: str) -> bool: ...
    def add_sampler(self, name: str, sampler: Sampler, every_s: float | Callable[[], float] | None = None) -> None: ...
    def register(self, action: str, handler: Handler, *, at_step_boundary: bool = True,
                 validate: Callable[[Command], None] | None = None) -> None: ...
    def submit(self, cmd: Command, on_result: ResultListener | None = None) -> None: ...
    def finish(self, cmd: Command, ok: bool, message: str, details: dict[str, Any] | None = None) -> None: ...
    def safe_point(self) -> None: ...
    def on_shutdown(self, hook: Callable[[], None]) -> None: ...
    def flush(self, timeout: float = 2.0) -> None: ...
    def detach_after_fork(self) -> None: ...
    def before_signal_death(self) -> None: ...


#: The agent's descriptors live at or above this number (or half the descriptor limit, if lower):
#: a script that closes and reopens low descriptors does not land on them.
HIGH_FD = 1000


def high_fd(fd: int) -> int:
    """Moves ``fd`` to a high number, close-on-exec (the old number is closed); ``fd`` itself if
    that cannot be done."""
    try:
        import fcntl
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        floor = HIGH_FD if soft == resource.RLIM_INFINITY else min(HIGH_FD, soft // 2)
        if floor <= 2:
            return fd
        new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor)
    except (OSError, ValueError, ImportError):
        return fd
    os.close(fd)
    return new

"""What feeds the dashboard: a *source* of protocol messages.

Live tailing of events.jsonl, attaching over a socket and replaying a recording all look the
same to :class:`tpuwatch.ui.app.TpuwatchApp`: it calls :meth:`Source.poll_tagged` at its refresh
rate, applies every message to a ``RunState`` (with the worker it came from) and renders one
snapshot. The app never blocks on a source, so a poll must return at once with whatever is new
(possibly nothing).

Nothing here imports Textual: headless mode (:mod:`tpuwatch.console.headless`) reads the same
sources, through :class:`RecordingSource`.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from tpuwatch.monitor.recording import ReadStats
from tpuwatch.protocol import Command, Message

#: A message with the name of the worker it came from (``None``: the worker its Hello names).
Tagged = tuple["str | None", Message]
#: A worker's health as a source sees it: (connected, why it is lost or None).
WorkerHealth = tuple[bool, "str | None"]


@runtime_checkable
class Source(Protocol):
    """A stream of run messages.

    ``live``: a training process is on the other end (quitting asks whether to stop it,
    detaching makes sense). ``can_send``: commands (profile, checkpoint) can reach the agent.
    """

    live: bool
    can_send: bool

    def poll(self) -> Sequence[Message]:
        """Messages that arrived since the last call, oldest first. Never blocks."""
        ...

    def poll_tagged(self) -> Sequence[Tagged]:
        """As :meth:`poll`, each message with its worker (several workers' streams feed one
        state and must stay apart). Consumers call one of the two, never both."""
        ...

    def health(self) -> Mapping[str, WorkerHealth]:
        """``{worker: (connected, lost reason or None)}`` for the workers this source can vouch
        for; empty when it has no say (one recording, a replay, one TCP stream)."""
        ...

    def read_stats(self) -> ReadStats | None:
        """Lines of the recording it could not read so far, when it reads a recording."""
        ...

    def send(self, command: Command) -> None:
        """Hands a command to the agent. Raises ``OSError`` with a one-line reason on failure."""
        ...

    def now(self) -> float | None:
        """The unix time the snapshot should be taken at; ``None`` means "the wall clock".

        A replay answers its cursor position, so elapsed times and staleness are those of the
        recording, not of today.
        """
        ...

    def close(self) -> None: ...


class RecordingSource(Source, Protocol):
    """A source that reads recordings on this host and can tell when it has read all there is
    (headless mode drains it before printing and at the end of the run)."""

    @property
    def caught_up(self) -> bool:
        """Whether the last poll reached the end of every recording."""
        ...

    def finish(self) -> Sequence[Tagged]:
        """The rest of every recording once the run has ended (a cut last line counts as cut)."""
        ...


@runtime_checkable
class ReplayControl(Protocol):
    """The transport controls of a recorded run (``Source.live`` is False)."""

    paused: bool
    speed: float
    #: Bumped each time the cursor moves backwards: the consumer must rebuild its state from
    #: scratch, and the next ``poll`` returns every message up to the new position.
    generation: int

    @property
    def position(self) -> float: ...  # recorded unix time of the cursor

    @property
    def start_t(self) -> float: ...

    @property
    def end_t(self) -> float: ...

    @property
    def at_end(self) -> bool: ...

    @property
    def seek_step_s(self) -> float: ...  # how far one seek key moves, recorded seconds

    def toggle_pause(self) -> None: ...

    def faster(self) -> None: ...

    def slower(self) -> None: ...

    def seek(self, delta_s: float) -> None: ...

    def seek_start(self) -> None: ...

    def seek_end(self) -> None: ...


def broadcast(command: Command, targets: Iterable[tuple[str, Callable[[Command], None]]], none_left: str) -> None:
    """Sends ``command`` with each ``(label, send)`` (a checkpoint or profile of a multi-worker
    job concerns every worker). Raises OSError naming each failure when none took it."""
    errors, sent = [], 0
    for label, send in targets:
        try:
            send(command)
            sent += 1
        except OSError as e:
            errors.append(f"{label}: {e}")
    if not sent:
        raise OSError("; ".join(errors) or none_left)


class HealthSink(Protocol):
    """What :func:`apply_worker_health` tells (``tpuwatch.monitor.state.RunState``)."""

    def set_connected(self, connected: bool, worker: str | None = None) -> None: ...

    def set_lost(self, reason: str, worker: str | None = None) -> None: ...


def apply_worker_health(source: Source, state: HealthSink) -> None:
    """Tells ``state`` which workers are connected or lost, as far as ``source`` knows
    (:meth:`Source.health`: a local group, or several TCP streams). A worker that went away is
    marked (disconnected, lost), never silently dropped."""
    health: Mapping[str, WorkerHealth] = source.health()
    for name, (connected, lost) in health.items():
        state.set_connected(connected, name)
        if lost:
            state.set_lost(lost, worker=name)

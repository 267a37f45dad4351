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

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from tpuwatch.monitor.group import WorkerDir
from tpuwatch.monitor.recording import ReadStats
from tpuwatch.protocol import Command, Message

if TYPE_CHECKING:
    from tpuwatch.control.client import AgentClient

#: A message with the name of the worker it came from (``None``: the worker its Hello names).
Tagged = tuple["str | None", Message]
#: A worker's health as a source sees it: (connected, why it is lost or None). Derived from its
#: :class:`WorkerStream` (:meth:`WorkerStream.health`), never kept.
WorkerHealth = tuple[bool, "str | None"]


@dataclass
class WorkerStream:
    """One worker's stream as a source follows it: a TCP stream to its agent
    (:class:`~tpuwatch.sources.remote_source.RemoteSource`) or its recording in a group directory
    (:class:`~tpuwatch.sources.group_source.GroupSource`). The one record a source keeps per
    worker: its health is derived from it (:meth:`health`), commands go out through its
    ``sender``. Read by tests, the status line and ``attach``'s stop (``address``, ``offset``)."""

    label: str  # how messages about it name it: HOST:PORT, or the worker's name
    worker: str | None = None  # its agent's name: a TCP stream's hello's; a group's, from run.json
    seen: bool = False  # a message of it arrived
    connected: bool = False
    ended: bool = False  # its exit record arrived: nothing more comes, no reconnect
    lost: str | None = None  # why it is lost (a group's worker whose process is gone, no end recorded)
    gone_since: float | None = None  # when its process was first found gone (a group's, source clock)
    sender: AgentClient | None = field(default=None, repr=False)  # commands to its agent
    # a group's worker
    dir: WorkerDir | None = None
    # a TCP stream
    address: tuple[str, int] = ("", 0)
    offset: int = 0  # bytes of the recording received as whole lines
    refused: str = ""  # the agent refused us (token, version): no reconnect
    connects: int = 0
    malformed: int = 0
    summary: bool = False  # ask the agent for summaries (False: the full stream)
    summaries: int = 0  # host_summary messages received
    switching: bool = False  # re-attaching in the other mode (not an outage)
    stop: threading.Event = field(default_factory=threading.Event, repr=False)
    client: AgentClient | None = field(default=None, repr=False)  # the stream's own connection

    def health(self) -> WorkerHealth | None:
        """(connected, lost reason) from its first message until it ends; ``None`` (no say) before
        and after, or while its agent's name is unknown."""
        if self.worker is None or not self.seen or self.ended:
            return None
        return (self.connected, self.lost)


def health_of(streams: Iterable[WorkerStream]) -> dict[str, WorkerHealth]:
    """``{worker: health}`` of the streams that have a say (:meth:`WorkerStream.health`)."""
    out: dict[str, WorkerHealth] = {}
    for s in streams:
        h = s.health()
        if h is not None and s.worker is not None:
            out[s.worker] = h
    return out


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

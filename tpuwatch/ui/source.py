"""What feeds the dashboard: a *source* of protocol messages.

Live tailing of events.jsonl, attaching over a socket and replaying a recording all look the
same to :class:`tpuwatch.ui.app.TpuwatchApp`: it calls :meth:`Source.poll` at its refresh rate,
applies every message to a ``RunState`` and renders one snapshot. The app never blocks on a
source, so ``poll`` must return at once with whatever is new (possibly nothing).

Nothing here imports Textual: the same sources can feed a headless consumer.
"""

from __future__ import annotations

from typing import Callable, Iterable, Protocol, Sequence, runtime_checkable

from tpuwatch.protocol import Command, Message


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

"""Runs the diagnostics engine beside a :class:`~tpuwatch.monitor.state.RunState`.

Every viewer (headless, dashboard, report) feeds the same messages to both and evaluates the
rules about once a second; findings land in the state, and, for the process that owns the run
(``tpuwatch run``), in the recording too (``on_new``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Iterable

from tpuwatch.monitor.diagnostics.engine import Engine
from tpuwatch.protocol import Finding, Hello, Message

if TYPE_CHECKING:
    from tpuwatch.monitor.state import RunState

EVALUATE_EVERY_S = 1.0


class FindingsFeed:
    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        every_s: float = EVALUATE_EVERY_S,
        on_new: Callable[[list[Finding]], None] | None = None,
    ) -> None:
        self.engine = Engine(clock=clock)
        self.every_s = every_s
        self.on_new = on_new
        self._worker = ""  # the single stream's agent, from its Hello
        self._next_t: float | None = None

    def apply(self, msg: Message, worker: str | None = None) -> None:
        """One message, in order. ``worker``: the sending agent (default: the last Hello's)."""
        if isinstance(msg, Finding):
            return  # the engine makes its own
        if isinstance(msg, Hello) and worker is None:
            self._worker = msg.worker
        self.engine.apply(msg, worker if worker is not None else self._worker)

    def feed(self, state: "RunState", messages: Iterable[Message]) -> None:
        for msg in messages:
            state.apply(msg)
            self.apply(msg)

    def evaluate(self, state: "RunState", now: float, force: bool = False) -> list[Finding]:
        """Evaluates the rules (at most every ``every_s`` unless forced); new findings go into ``state``."""
        if not force and self._next_t is not None and now < self._next_t:
            return []
        self._next_t = now + self.every_s
        new = self.engine.evaluate(now)
        state.set_input_figures(self.engine.input_figures())
        state.set_stall_episodes(self.engine.stall_episodes(now))
        for f in new:
            state.add_finding(f, f.worker)
        if new and self.on_new is not None:
            self.on_new(new)
        return new

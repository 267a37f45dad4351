"""Runs the diagnostics engine beside a :class:`~tpuwatch.monitor.state.RunState`.

Every viewer (headless, dashboard, relay, report) feeds the same messages to both, the state
first, and evaluates the rules about once a second, through one
:class:`~tpuwatch.monitor.monitor.Monitor` (``Monitor.take``). Given the state (``FindingsFeed(state=...)``), the
engine reads and updates the state's own worker records (``RunState.telemetry``: one record per
worker, its facts noted once); findings land in the state, and, for the process that owns the run
(``tpuwatch run``), in the recording too (``on_new``). The owner reads its own recording: the
lines of the findings it wrote come back to it, and :meth:`FindingsFeed.read_back` tells them
apart (they are in the state already; applied again, a stale copy would replace a later verdict).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Callable

from tpuwatch.monitor.diagnostics.engine import Engine
from tpuwatch.protocol import Finding, Hello, Message

if TYPE_CHECKING:
    from tpuwatch.monitor.state import RunState

EVALUATE_EVERY_S = 1.0
#: A worker whose first steps arrived is judged at the first drain this long after the last
#: evaluation, not a whole ``every_s`` later: on a pod, the straggler is one host among those
#: joining (measured at 1,024 hosts: ~0.75 s of the ~0.9 s between its first summary reaching
#: the viewer and the finding on screen went waiting for the next evaluation). Half a second
#: bounds the evaluations while a thousand hosts join to two a second.
JOINED_EVALUATE_S = 0.5
#: Findings handed to ``on_new`` and not yet read back (a bound: a write that failed never comes back).
_HANDED_OUT_MAX = 10_000


class FindingsFeed:
    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        every_s: float = EVALUATE_EVERY_S,
        on_new: Callable[[list[Finding]], None] | None = None,
        state: "RunState | None" = None,
    ) -> None:
        """``state``: the run state fed beside (its worker records are the engine's)."""
        self.engine = Engine(clock=clock, telemetry=state.telemetry if state is not None else None)
        self._shared = state is not None
        self.every_s = every_s
        self.on_new = on_new
        self._worker = ""  # the single stream's agent, from its Hello
        self._next_t: float | None = None
        self._judged_workers = 0  # engine.workers_with_steps at the last evaluation
        self._handed_out: Counter[tuple[str, str, float, str, str]] = Counter()

    def read_back(self, msg: Message) -> bool:
        """Whether ``msg`` is a finding this feed handed to ``on_new``, read back from the
        recording it went into: the state has it since it was found, so the caller skips it."""
        if not self._handed_out or not isinstance(msg, Finding):
            return False
        key = _identity(msg)
        if not self._handed_out[key]:
            return False
        self._handed_out[key] -= 1
        if not self._handed_out[key]:
            del self._handed_out[key]
        return True

    def apply(self, msg: Message, worker: str | None = None) -> None:
        """One message, in order. ``worker``: the sending agent (default: the last Hello's)."""
        if isinstance(msg, Finding):
            return  # the engine makes its own
        if self._shared:
            self.engine.apply(msg, worker)  # the state named the workers (the default: the last Hello's)
            return
        if isinstance(msg, Hello) and worker is None:
            self._worker = msg.worker
        self.engine.apply(msg, worker if worker is not None else self._worker)

    def evaluate(self, state: "RunState", now: float, force: bool = False) -> list[Finding]:
        """Evaluates the rules (at most every ``every_s`` unless forced, or :data:`JOINED_EVALUATE_S`
        after the last time when a worker's first steps came since); new findings go into ``state``."""
        joined = self.engine.workers_with_steps != self._judged_workers
        if not force and self._next_t is not None and now < self._next_t and not (
                joined and now >= self._next_t - self.every_s + min(JOINED_EVALUATE_S, self.every_s)):
            return []
        self._next_t = now + self.every_s
        self._judged_workers = self.engine.workers_with_steps
        new = self.engine.evaluate(now)
        for f in self.engine.folded:  # found alone earlier, now evidence of its cause's finding
            state.drop_finding(f, f.worker)
        state.set_input_figures(self.engine.input_figures())
        state.set_stall_episodes(self.engine.stall_episodes(now))
        for f in new:
            state.add_finding(f, f.worker)
        if new and self.on_new is not None:
            if len(self._handed_out) > _HANDED_OUT_MAX:
                self._handed_out.clear()
            self._handed_out.update(_identity(f) for f in new)
            self.on_new(new)
        return new


def _identity(f: Finding) -> tuple[str, str, float, str, str]:
    """What tells one finding from another once it has been through the recording (its
    evidence, a mapping, is not hashable)."""
    return (f.rule, f.worker, f.t, f.severity, f.message)

"""A run as a viewer follows it: its state, its findings and its step figures, fed together.

Every viewer takes the run's messages the same way: the state first (``RunState.apply``: it
notes each message's facts about its worker), then the diagnostics engine
(``FindingsFeed.apply``: it finds them noted), then the run's step figures (``RunSteps``: every
step time, for the whole-run p50/p95). A finding this viewer recorded itself (the process that
owns the run writes its findings into the recording) comes back as it reads the recording on;
it is in the state since it was found, and is skipped. :meth:`Monitor.take` is that one way in,
:meth:`Monitor.evaluate` runs the rules, :meth:`Monitor.snapshot` is the one way out.
"""

from __future__ import annotations

import time
from typing import Callable

from tpuwatch.monitor.diagnostics.feed import EVALUATE_EVERY_S, FindingsFeed
from tpuwatch.monitor.snapshot import Baseline, RunSnapshot
from tpuwatch.monitor.state import RunState
from tpuwatch.monitor.stats import RunSteps
from tpuwatch.protocol import Finding, Message, Step


class Monitor:
    """The run state, the findings feed beside it and the run's step figures, owned together.

    ``on_new``: new findings, handed over to be recorded (the run's owner); they are skipped when
    read back. ``recorded_findings``: whether findings read from the recording go into the state
    (False for a view beside the owner whose own engine makes the same ones). ``steps_of``: the
    worker whose step records make the step figures (None: every record; the workers of a group
    run the same global steps). ``on_step``: called with each of those records. ``step_figures``:
    False for a live view that shows rolling figures only (the whole run's step times cost 8
    bytes a record); :attr:`steps` is then None.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        *,
        on_new: Callable[[list[Finding]], None] | None = None,
        baseline: Baseline | None = None,
        every_s: float = EVALUATE_EVERY_S,
        recorded_findings: bool = True,
        steps_of: str | None = None,
        on_step: Callable[[Step], None] | None = None,
        step_figures: bool = True,
    ) -> None:
        self.state = RunState(clock=clock)
        self.state.baseline = baseline
        self.feed = FindingsFeed(clock, every_s, on_new=on_new, state=self.state)
        self.steps = RunSteps(on_step) if step_figures else None
        self._recorded_findings = recorded_findings
        self._steps_of = steps_of

    def take(self, msg: Message, worker: str | None = None) -> bool:
        """One message, in order (``worker``: its sender in a group; default: the last Hello's).
        False when it was skipped: a finding of this viewer's own read back, or a recorded one
        this view does not take."""
        if isinstance(msg, Finding) and (not self._recorded_findings or self.feed.read_back(msg)):
            return False
        self.state.apply(msg, worker)
        self.feed.apply(msg, worker)
        steps = self.steps
        if steps is not None and type(msg) is Step and (self._steps_of is None or worker == self._steps_of):
            steps.add(msg)
        return True

    def evaluate(self, now: float, force: bool = False) -> list[Finding]:
        """Runs the rules (about once a second unless ``force``); new findings go into the state."""
        return self.feed.evaluate(self.state, now, force)

    def snapshot(self, now: float | None = None) -> RunSnapshot:
        return self.state.snapshot(now)

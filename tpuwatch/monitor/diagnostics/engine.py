"""The diagnostics engine: protocol messages in, :class:`~tpuwatch.protocol.Finding` s out.

Usage (live, about once a second, and once at the end of ``tpuwatch report``)::

    eng = Engine(clock=time.time)
    for msg, worker in messages:
        eng.apply(msg, worker=worker)      # every message, in order; cheap for Step
    new = eng.evaluate()                   # findings that are new or changed
    eng.findings()                         # the current set, worst first

``apply`` costs a few microseconds per Step (bounded windows, no allocation beyond one tuple);
windowed rules are re-checked every ``check_every_records`` step records so a replayed
recording finds the same episodes a live viewer would have seen. Memory is bounded whatever
the length of the run.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

from tpuwatch.protocol import (
    AUTO_PROFILE_ID_PREFIX,
    SEVERITY_RANK,
    AllocationSites,
    CommandState,
    Config,
    DeviceSample,
    Epoch,
    Finding,
    HostSample,
    HostSites,
    HostSummary,
    InputStages,
    Message,
    Phase,
    Pipeline,
    Result,
    Retrace,
    Step,
    Teardown,
    Topology,
)

from .crash import ScriptCrash
from .folding import fold
from .host_bound import HostBound
from .input_pipeline import InputBound
from .input_share import InputFigures, combine
from .loss import LossNonfinite, ReplicaLossSkew
from .memory import DeviceMemoryHeadroom, HostMemoryGrowth
from .progress import Stall, StepTimeJitter
from .rule import Rule
from .slow_steps import SlowStepsRule
from .telemetry import WHOLE_RUN, Telemetry, Worker
from .thresholds import Thresholds
from .tpu_config import BatchSizeAlignment, Float32OnTpu
from .tracing import FunctionRecreated, RetraceStorm
from .workers import StragglerHost

#: Every rule, in the order findings of equal severity are listed.
RULES: tuple[type[Rule], ...] = (
    LossNonfinite,  # a NaN that made the script raise says more than the raise itself
    ScriptCrash,
    Stall,
    InputBound,
    HostBound,
    RetraceStorm,
    FunctionRecreated,
    HostMemoryGrowth,
    DeviceMemoryHeadroom,
    ReplicaLossSkew,
    StragglerHost,
    StepTimeJitter,
    SlowStepsRule,
    BatchSizeAlignment,
    Float32OnTpu,
)
RULE_IDS: tuple[str, ...] = tuple(r.id for r in RULES)

Observer = Callable[[Message, Worker, Telemetry], None]


class Engine:
    """Runs every diagnostics rule over a run's messages.

    ``clock`` gives ``now`` (unix seconds) when :meth:`evaluate` is called without one.
    ``thresholds`` and/or keyword overrides (``Engine(stall_min_s=120)``) change the
    defaults documented in :class:`Thresholds`; an unknown name is a ``TypeError``.
    """

    def __init__(self, clock: Callable[[], float] = time.time,
                 thresholds: Thresholds | None = None, *, telemetry: Telemetry | None = None,
                 **overrides: float) -> None:
        """``telemetry``: the workers' records to read and update, a run state's
        (``RunState.telemetry``) when the engine runs beside one; its thresholds are the
        engine's. Default: records of its own."""
        if telemetry is not None and (thresholds is not None or overrides):
            raise TypeError("an engine over a run state's records has that state's thresholds")
        self.thresholds = (telemetry.th if telemetry is not None
                           else Thresholds.with_overrides(thresholds, **overrides))
        if self.thresholds.check_every_records < 1:
            raise ValueError("check_every_records must be at least 1")
        self._clock = clock
        self.telemetry = telemetry if telemetry is not None else Telemetry(self.thresholds)
        self.rules: tuple[Rule, ...] = tuple(cls(self.thresholds) for cls in RULES)
        observers: dict[type, list[Observer]] = {}
        for rule in self.rules:
            for tp in rule.observes:
                observers.setdefault(tp, []).append(rule.observe)
        self._observers = {tp: tuple(fns) for tp, fns in observers.items()}
        self._step_observers = self._observers.get(Step, ())
        self._countdown = self.thresholds.check_every_records
        self._step_workers = 0
        #: Workers with step records or summaries of them (the rules' evidence: one that joins
        #: is judged at the feed's next drain, see FindingsFeed.evaluate).
        self.workers_with_steps = 0
        self._check_due_t = float("inf")  # agent time of the next time-based check
        self._applied = 0  # messages applied
        self._checked_at = -1  # value of _applied at the last windowed check
        self._current: dict[tuple[str, str], Finding] = {}
        # the findings the last evaluate() folded into their cause's (a holder of findings
        # found earlier, such as the run state, drops them)
        self.folded: list[Finding] = []
        self._shown: dict[tuple[str, str], tuple[str, str]] = {}

    # --- input ---------------------------------------------------------------------------

    def apply(self, msg: Message, worker: str | None = "") -> None:
        """Takes one protocol message from agent ``worker`` (messages in order; ``None``: the
        worker of the records' default, the last Hello's). Beside a run state, apply each
        message to the state first: it names the workers (:meth:`Telemetry.hello`)."""
        tel = self.telemetry
        w = tel.workers.get(worker) if worker is not None else None
        if w is None:
            w = tel.worker(worker)
        w.note(msg)  # the facts first (a no-op when the state beside took them)
        if type(msg) is Step:  # the hot path: one record per training-step call
            for observe in self._step_observers:
                observe(msg, w, tel)  # before the windows move on (w.prev_step: the previous step)
            if w.records == 0:
                self._step_workers += 1
                self.workers_with_steps += 1
                if self._step_workers == 1:
                    self._check_due_t = msg.t + self.thresholds.input_recent_s
            self._applied += 1
            w.on_step(msg)
            tel.steps_seen = True
            self._countdown -= 1
            if self._countdown <= 0 or msg.t >= self._check_due_t:
                # every worker's window moves on by about check_every_records between checks,
                # so the cost per record does not grow with the number of workers; with slow
                # steps the time limit comes first, so every input window is checked
                self._countdown = self.thresholds.check_every_records * self._step_workers
                self._check_due_t = msg.t + self.thresholds.input_recent_s
                self._check_all()
            return
        self._applied += 1
        for observe in self._observers.get(type(msg), ()):
            observe(msg, w, tel)
        if isinstance(msg, HostSample):
            w.on_host(msg)
        elif isinstance(msg, DeviceSample):
            w.on_device(msg)
        elif type(msg) is HostSummary:
            joined = w.records == 0
            w.on_summary(msg)
            if joined and w.records:
                self.workers_with_steps += 1
            if msg.records:
                tel.steps_seen = True
            host = msg.host_sample()
            if host is not None:
                w.on_host(host)
            for d in msg.device_samples():
                w.on_device(d)
        elif isinstance(msg, Retrace):
            w.on_retrace(msg.t)
        elif isinstance(msg, Pipeline):
            w.on_pipeline(msg)
        elif isinstance(msg, AllocationSites):
            if msg.sites or w.allocations is None or not w.allocations.sites:
                w.allocations = msg  # a later window that found nothing never hides a line found
        elif isinstance(msg, HostSites):
            w.host_sites = msg
        elif isinstance(msg, InputStages):
            w.input_stages = msg
        elif isinstance(msg, (CommandState, Result)) and msg.id.startswith(AUTO_PROFILE_ID_PREFIX):
            w.capturing = isinstance(msg, CommandState) and msg.state == "running"
            w.captured_since_sample = w.captured_since_sample or w.capturing
        elif isinstance(msg, Epoch):
            w.on_epoch(msg)
        elif isinstance(msg, Phase):
            w.on_phase(msg)
        elif isinstance(msg, Teardown):
            w.on_teardown(msg)
        elif isinstance(msg, Topology):
            tel.on_topology(msg)
        elif isinstance(msg, Config):
            tel.on_config(msg)

    def _check_all(self) -> None:
        self._checked_at = self._applied
        for rule in self.rules:
            rule.check(self.telemetry)

    # --- output --------------------------------------------------------------------------

    def evaluate(self, now: float | None = None) -> list[Finding]:
        """Runs every rule; returns the findings that are new, or whose severity or message
        (which carries the key numbers, rounded for display) changed since the last call.

        ``now`` defaults to ``clock()``. For a report over a finished recording it only
        matters to ``stall`` when the recording has neither samples nor an exit.
        """
        now = self._clock() if now is None else now
        if self._applied != self._checked_at:
            self._check_all()  # something arrived since the last check
        current: dict[tuple[str, str], Finding] = {}
        for rule in self.rules:
            for subject, f in rule.current(self.telemetry, now).items():
                current[(rule.id, subject)] = f
        kept = fold(current)  # one cause, one finding
        several = len(self.telemetry.step_workers()) > 1
        new: list[Finding] = []
        self.folded = []
        for key in current:
            if key not in kept:
                self.folded.append(current[key])
                self._current.pop(key, None)  # folded into the finding of its cause
                self._shown.pop(key, None)  # if it stands alone again, it is news again
                continue
            f = kept[key]
            if several and f.worker and f.worker not in f.message:
                # a finding about one worker of several says whose figures these are (the
                # merged summary beside it speaks for all of them)
                f = replace(f, message=f"{f.worker}: {f.message}")
            self._current[key] = f
            shown = (f.severity, f.message)
            if self._shown.get(key) != shown:
                self._shown[key] = shown
                new.append(f)
        return _worst_first(new)

    def input_figures(self) -> InputFigures:
        """Every input-wait figure, all workers together and each on its own, as the
        ``input-bound`` rule computes them (the definition in :mod:`.input_share`)."""
        th = self.thresholds
        ws = self.telemetry.step_workers()
        recents = [w.recent_input_share() for w in ws]  # O(window) each when it moved
        per = tuple((w.name, w.run_input_totals().share(th), WHOLE_RUN) if w.ended else (w.name, *recent)
                    for w, recent in zip(ws, recents))
        running = [scope for _, _, scope in per if scope != WHOLE_RUN]
        return InputFigures(
            shown=combine((share for _, share, _ in per), th),
            scope=running[0] if running else (WHOLE_RUN if per else ""),
            recent=combine((share for share, _ in recents), th),
            run=combine((w.run_input_totals().share(th) for w in ws), th),
            workers=per,
        )

    def stall_episodes(self, now: float | None = None) -> dict[str, list[tuple[float, float]]]:
        """Each worker's stall episodes, (start, end) unix times (the one going on ends at
        ``now``, else at its finding's gap): the goodput ledger's *stalled* time."""
        stall = next(r for r in self.rules if isinstance(r, Stall))
        return {name: stall.episodes(name, self.telemetry, now) for name in self.telemetry.workers}

    def findings(self) -> list[Finding]:
        """The current findings (latest per rule and subject, as of the last
        :meth:`evaluate`), worst first."""
        return _worst_first(list(self._current.values()))


def _worst_first(fs: list[Finding]) -> list[Finding]:
    order = {rid: i for i, rid in enumerate(RULE_IDS)}
    return sorted(fs, key=lambda f: (-SEVERITY_RANK[f.severity], order.get(f.rule, 99)))

"""The shape every rule has, and how a rule keeps its findings over a run."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from tpuwatch.protocol import SEVERITY_RANK, Finding, Message

from .telemetry import Telemetry, Worker
from .thresholds import Thresholds


class Rule:
    """One diagnostics rule.

    ``observes`` lists the message types the rule wants in :meth:`observe` (called from
    ``Engine.apply``: keep it O(1)). :meth:`check` re-examines windows; the engine calls it
    every ``check_every_records`` step records (per worker) and before an evaluation when step
    records arrived since, so episodes are found the same way live and in a replay.
    :meth:`current` returns the rule's findings.

    Findings are sticky: once a condition was seen, its finding stays (a report must show the
    input-bound hour even if the run recovered). :meth:`_keep` keeps the worst severity per
    subject; at equal severity the latest numbers win and the first step is kept.
    """

    id: ClassVar[str] = ""
    observes: ClassVar[tuple[type[Message], ...]] = ()

    def __init__(self, th: Thresholds) -> None:
        self.th = th
        self._found: dict[str, Finding] = {}

    def observe(self, msg: Message, w: Worker, tel: Telemetry) -> None:
        """Called for each message of a type in ``observes``."""

    def check(self, tel: Telemetry) -> None:
        """Re-examines windows; records findings with :meth:`_keep`."""

    def current(self, tel: Telemetry, now: float) -> dict[str, Finding]:
        """Subject -> latest finding (the engine has just run :meth:`check` if anything moved);
        rules that depend on ``now`` override this."""
        return self._found

    def _keep(self, subject: str, f: Finding) -> None:
        old = self._found.get(subject)
        if old is not None:
            r_old, r_new = SEVERITY_RANK[old.severity], SEVERITY_RANK[f.severity]
            if r_new < r_old:
                return
            if old.first_step is not None and (f.first_step is None or old.first_step < f.first_step):
                f = replace(f, first_step=old.first_step)
        self._found[subject] = f


"""The one definition of "how much of the step waits for input", used everywhere.

The share is **total input wait / total step time over the eligible steps that measured their
wait, with the single largest wait left out**. Eligible: not the first records of a worker, nor
the records right after a retrace or an epoch boundary (tracing, compilation, a new iterator
filling its shuffle buffer). The wait counts every fetch the agent timed: in-graph fetches inside
the compiled step (Keras ``fit``) and eager ``for x in dist_dataset`` fetches between steps.

The verdict applies xprof's thresholds (>= 5 % "moderately", >= 20 % "highly" input-bound) to
the share of step time, whatever the step's length, when the mean wait is at least
``input_min_wait_s`` (0.1 ms: below it, timer noise) and at least ``input_min_records`` steps
were measured.

The ``input-bound`` finding, the Input panel, the headless lines, ``tpuwatch report`` and the
profile summary all quote :class:`InputShare` values computed here, so they agree.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Sequence

from tpuwatch.units import percent

from .thresholds import Thresholds

InputLevel = Literal["unknown", "low", "moderate", "high"]

VERDICT_TEXT: dict[InputLevel, str] = {
    "high": "highly input-bound",
    "moderate": "moderately input-bound",
    "low": "not input-bound",
    "unknown": "input wait: too few steps to judge",
}


@dataclass(frozen=True)
class InputShare:
    """Input wait over a set of eligible steps (``steps`` counts training steps, the worst left out)."""

    share: float  # wait / step time, 0..1
    wait_per_step_s: float
    step_time_s: float  # mean per step
    steps: int
    first_step: int
    last_step: int
    level: InputLevel

    @property
    def verdict(self) -> str:
        return VERDICT_TEXT[self.level]

    def describe(self) -> str:
        """``"66% of step time waiting for input (20 ms of 31 ms per step, 115 steps)"``."""
        return (f"{percent(self.share)} of step time waiting for input "
                f"({_ms(self.wait_per_step_s)} of {_ms(self.step_time_s)} per step, "
                f"{self.steps} steps)")


@dataclass(frozen=True)
class InputFigures:
    """Every input-wait figure a viewer shows, from one computation (the engine's).

    ``shown`` is what the ``input-bound`` rule judges now, in words ``scope``: the latest window
    while the run goes on, every eligible step once it has ended. ``recent`` and ``run`` are the
    two scopes for views that show both; ``workers`` is ``shown``'s per-worker counterpart."""

    shown: InputShare | None = None
    scope: str = ""
    recent: InputShare | None = None
    run: InputShare | None = None
    workers: tuple[tuple[str, InputShare | None, str], ...] = ()

    def of_worker(self, name: str) -> tuple[InputShare | None, str]:
        return self._by_worker.get(name, (None, ""))

    @functools.cached_property
    def _by_worker(self) -> dict[str, tuple[InputShare | None, str]]:
        # a dict once, not a scan per worker: a pod's snapshot asks for a thousand of them
        out: dict[str, tuple[InputShare | None, str]] = {}
        for n, share, scope in self.workers:
            out.setdefault(n, (share, scope))
        return out


class InputTotals:
    """Running sums over eligible records, keeping the record with the largest wait apart."""

    __slots__ = ("wait", "time", "steps", "worst", "first_step", "last_step")

    def __init__(self) -> None:
        self.wait = 0.0
        self.time = 0.0
        self.steps = 0
        self.worst: tuple[float, float, int] | None = None  # (wait, step time, k) per step
        self.first_step: int | None = None
        self.last_step = 0

    def add(self, step: int, step_time_s: float, wait_s: float, k: int) -> None:
        if self.first_step is None:
            self.first_step = step
        self.last_step = step
        worst = self.worst
        if worst is None or wait_s > worst[0]:
            if worst is not None:
                self.wait += worst[0] * worst[2]
                self.time += worst[1] * worst[2]
                self.steps += worst[2]
            self.worst = (wait_s, step_time_s, k)
        else:
            self.wait += wait_s * k
            self.time += step_time_s * k
            self.steps += k

    def share(self, th: Thresholds) -> InputShare | None:
        if self.first_step is None:
            return None
        return _judge(self.wait, self.time, self.steps, self.first_step, self.last_step, th)


def window_share(records: Iterable[tuple[Any, ...]], th: Thresholds) -> InputShare | None:
    """The share over telemetry window records ``(step, t, step_time_s, wait_s, k, fn)``."""
    tot = InputTotals()
    for r in records:
        if r[3] is not None:
            tot.add(r[0], r[2], r[3], r[4])
    return tot.share(th)


def recent_records(records: Sequence[tuple[Any, ...]], th: Thresholds) -> tuple[list[tuple[Any, ...]], str]:
    """The live window: the latest records within ``input_recent_s`` of the newest, reaching
    back further only to have ``input_min_records`` measured steps to judge (plus the worst one,
    left out). Returns the records and the scope in words, stable while the window's kind stays
    ("over the last 30 s", or "over the last 1,024 steps" when the records run out first or
    a slow run needs more than 30 s for its minimum)."""
    if not records:
        return [], ""
    newest_t = records[-1][1]
    need = th.input_min_records + 1
    out: list[tuple[Any, ...]] = []
    measured = 0
    reached_back = False  # a record older than the window was taken to reach the minimum
    time_cut = False
    for r in reversed(records):
        if newest_t - r[1] > th.input_recent_s:
            if measured >= need:
                time_cut = True
                break
            reached_back = True
        out.append(r)
        if r[3] is not None:
            measured += 1
    out.reverse()
    full = len(out) == len(records) and len(records) == th.window_records
    if reached_back or (full and not time_cut):
        return out, f"over the last {sum(r[4] for r in out):,} steps"
    return out, f"over the last {th.input_recent_s:.0f} s"


def recent_share(records: Sequence[tuple[Any, ...]], th: Thresholds) -> tuple[InputShare | None, str]:
    """The live verdict's share and its scope in words (:func:`recent_records`)."""
    rs, scope = recent_records(records, th)
    return window_share(rs, th), scope


def combine(shares: Iterable[InputShare | None], th: Thresholds) -> InputShare | None:
    """Several workers' shares as one (sums of their steps' waits and times)."""
    got = [s for s in shares if s is not None]
    if not got:
        return None
    if len(got) == 1:
        return got[0]
    wait = sum(s.wait_per_step_s * s.steps for s in got)
    time_ = sum(s.step_time_s * s.steps for s in got)
    steps = sum(s.steps for s in got)
    return _judge(wait, time_, steps, min(s.first_step for s in got), max(s.last_step for s in got), th)


def level_of(share: float, wait_per_step_s: float, steps: int, th: Thresholds) -> InputLevel:
    if steps < th.input_min_records:
        return "unknown"
    if share < th.input_info_frac or wait_per_step_s < th.input_min_wait_s:
        return "low"
    return "high" if share >= th.input_warning_frac else "moderate"


def _judge(wait: float, time_: float, steps: int, first: int, last: int, th: Thresholds) -> InputShare | None:
    if steps <= 0 or time_ <= 0:
        return None
    share = min(1.0, max(0.0, wait / time_))
    per = wait / steps
    return InputShare(share, per, time_ / steps, steps, first, last, level_of(share, per, steps, th))


def _ms(seconds: float) -> str:
    v = seconds * 1000
    return f"{v:.0f} ms" if v >= 10 else f"{v:.2g} ms"

"""Bounded, incremental statistics over step records.

Everything here is O(1) amortised per record and O(1) in memory over a run of any length, so
a viewer can follow a million-step run (or load its recording) without growing:

- :func:`percentile` on a small sorted sample (linear interpolation, like numpy's default);
- :class:`StepStats`: a ring of the last ``window`` records for rolling p50/p95, a time window
  for steps/s and examples/s, and a :class:`History` for plots (input wait has one computation,
  the diagnostics' :mod:`~tpuwatch.monitor.diagnostics.input_share`);
- :class:`History`: at most ``max_points`` buckets; when full, neighbouring buckets are merged
  pairwise and each new bucket covers twice as many records.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

from tpuwatch.figures import quantile
from tpuwatch.monitor.snapshot import StepPoint
from tpuwatch.protocol import Message, Step


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of already sorted values, linearly interpolated: the one
    quantile (:func:`tpuwatch.figures.quantile`), so ``percentile(v, 50)``
    is the one median. Raises ``ValueError`` on an empty sequence.
    """
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    return quantile(sorted_values, q / 100.0)


class _Bucket:
    """Running aggregate of consecutive step records (mutable while it is the open bucket)."""

    __slots__ = ("step", "t", "records", "steps", "time_sum", "wait_sum", "wait_steps",
                 "loss_sum", "loss_n", "loss_min", "loss_max")

    def __init__(self) -> None:
        self.step = 0
        self.t = 0.0
        self.records = 0
        self.steps = 0  # training steps covered (a record may be k steps)
        self.time_sum = 0.0  # sum of per-step time x steps
        self.wait_sum = 0.0
        self.wait_steps = 0  # steps whose input wait was measured
        self.loss_sum = 0.0
        self.loss_n = 0  # records with a finite loss
        self.loss_min = math.inf
        self.loss_max = -math.inf

    def add(self, step: int, t: float, steps: int, step_time_s: float, input_wait_s: float | None,
            loss: float | None, lo: float | None, hi: float | None) -> None:
        self.step = step
        self.t = t
        self.records += 1
        self.steps += steps
        self.time_sum += step_time_s * steps
        if input_wait_s is not None:
            self.wait_sum += input_wait_s * steps
            self.wait_steps += steps
        if loss is not None and math.isfinite(loss):
            self.loss_sum += loss
            self.loss_n += 1
        if lo is not None and lo < self.loss_min:
            self.loss_min = lo
        if hi is not None and hi > self.loss_max:
            self.loss_max = hi

    def merge(self, later: _Bucket) -> None:
        self.step = later.step
        self.t = later.t
        self.records += later.records
        self.steps += later.steps
        self.time_sum += later.time_sum
        self.wait_sum += later.wait_sum
        self.wait_steps += later.wait_steps
        self.loss_sum += later.loss_sum
        self.loss_n += later.loss_n
        self.loss_min = min(self.loss_min, later.loss_min)
        self.loss_max = max(self.loss_max, later.loss_max)

    def point(self) -> StepPoint:
        return StepPoint(
            step=self.step,
            t=self.t,
            step_time_s=self.time_sum / self.steps if self.steps else 0.0,
            input_wait_s=self.wait_sum / self.wait_steps if self.wait_steps else None,
            loss=self.loss_sum / self.loss_n if self.loss_n else None,
            loss_min=self.loss_min if self.loss_min != math.inf else None,
            loss_max=self.loss_max if self.loss_max != -math.inf else None,
        )


def _loss_range(msg: Step) -> tuple[float | None, float | None]:
    """Min and max over the replicas' finite losses (or the loss itself), for the plot band.

    A non-finite replica loss would make the band useless; it is flagged elsewhere
    (``ReplicaLoss.finite``)."""
    rl = msg.replica_losses
    if rl:
        if math.isfinite(sum(rl)):  # the common case, without a per-value check
            return min(rl), max(rl)
        values = [v for v in rl if math.isfinite(v)]
        if values:
            return min(values), max(values)
    loss = msg.loss
    if loss is not None and math.isfinite(loss):
        return loss, loss
    return None, None


def _bucket_of(records: list[Step]) -> _Bucket:
    b = _Bucket()
    for m in records:
        lo, hi = _loss_range(m)
        b.add(m.step, m.t, m.steps, m.step_time_s, m.input_wait_s, m.loss, lo, hi)
    return b


class History:
    """Downsampled step history: at most ``max_points`` points, oldest first.

    Each point is a bucket of ``records_per_point`` consecutive records (the last, open bucket may
    hold fewer); when ``max_points`` buckets are closed, pairs are merged and the bucket width
    doubles. Memory stays O(max_points + records_per_point) = O(max_points) for any run length
    (a run of R records keeps at most ~2R/max_points open records), and work is O(1) amortised
    per record: the open bucket only collects records, which are aggregated once when it closes.
    """

    def __init__(self, max_points: int = 2000) -> None:
        if max_points < 4 or max_points % 2:
            raise ValueError(f"max_points must be an even number >= 4, got {max_points}")
        self.max_points = max_points
        self.records_per_point = 1
        self._closed: list[_Bucket] = []
        self._points: list[StepPoint] = []  # cached StepPoint of each closed bucket
        self._open: list[Step] = []
        self._cache: tuple[StepPoint, ...] | None = ()

    def add(self, msg: Step) -> None:
        open_ = self._open
        open_.append(msg)
        self._cache = None
        if len(open_) >= self.records_per_point:
            b = _bucket_of(open_)
            self._open = []
            self._closed.append(b)
            self._points.append(b.point())
            if len(self._closed) >= self.max_points:
                self._halve()

    def _halve(self) -> None:
        merged: list[_Bucket] = []
        for i in range(0, len(self._closed) - 1, 2):
            a = self._closed[i]
            a.merge(self._closed[i + 1])
            merged.append(a)
        self._closed = merged
        self._points = [b.point() for b in merged]
        self.records_per_point *= 2

    def __len__(self) -> int:
        return len(self._closed) + (1 if self._open else 0)

    def points(self) -> tuple[StepPoint, ...]:
        """The history as points, oldest first (cached until the next record)."""
        if self._cache is None:
            tail = (_bucket_of(self._open).point(),) if self._open else ()
            self._cache = tuple(self._points) + tail
        return self._cache


#: Seconds of wall time the live steps/s and examples/s are over. Short enough that a slowdown
#: shows within seconds, as the step times beside them do (30 s read the old speed ~20 s after the
#: steps slowed); at least two records are kept, so a step slower than this still has a rate.
RATE_WINDOW_S = 10.0


@dataclass(frozen=True)
class Rolling:
    """Rolling figures over the recent window (``None`` where not measurable yet)."""

    step_p50_s: float | None
    step_p95_s: float | None
    steps_per_s: float | None
    examples_per_s: float | None


class StepStats:
    """Statistics of one stream of step records (one worker).

    ``window`` records feed the percentiles; ``rate_window_s`` seconds of wall time feed steps/s
    and examples/s (at most ``rate_max_records`` records are kept for that, so at very high
    rates the rate window is shorter, never the memory larger).
    """

    def __init__(self, window: int = 200, rate_window_s: float = RATE_WINDOW_S,
                 rate_max_records: int = 4096, history_points: int = 2000) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if rate_window_s <= 0:
            raise ValueError(f"rate_window_s must be > 0, got {rate_window_s}")
        self.rate_window_s = rate_window_s
        self._recent: deque[Step] = deque(maxlen=window)
        # (t, global step, cumulative examples) for rates
        self._rate: deque[tuple[float, int, int]] = deque(maxlen=rate_max_records)
        self._examples = 0
        # examples per step of the latest record that carried them: a record without (the agent
        # paces its reads) is a step of the same batch, not a step of no examples
        self._batch: int | None = None
        self.history = History(history_points)
        self.records = 0
        self.steps_total = 0  # training steps seen (sum of Step.steps)
        self.first: Step | None = None
        self.last: Step | None = None
        self._rolling: tuple[int, Rolling] | None = None  # (records when computed, figures)

    def add(self, msg: Step) -> None:
        """Adds one record. O(1) amortised (~1-2 us)."""
        if self.first is None:
            self.first = msg
        self.last = msg
        self.records += 1
        k = msg.steps
        self.steps_total += k
        batch = msg.examples
        if batch is not None:
            self._batch = batch
        elif self._batch is not None:
            batch = self._batch
        if batch is not None:
            self._examples += batch * k
        self._recent.append(msg)
        self._rate.append((msg.t, msg.step, self._examples))
        self.history.add(msg)

    @property
    def window_records(self) -> int:
        """Records the rolling p50/p95 are over now (at most ``window``)."""
        return len(self._recent)

    def recent(self) -> tuple[Step, ...]:
        return tuple(self._recent)

    def rolling(self) -> Rolling:
        """Rolling figures; O(window) (a sort of ``window`` floats) once per new record: a viewer
        of a 64-host pod asks for every worker's figures at each snapshot, most of them unchanged
        since the last one."""
        if self._rolling is None or self._rolling[0] != self.records:
            self._rolling = (self.records, self._compute_rolling())
        return self._rolling[1]

    def _compute_rolling(self) -> Rolling:
        recent = self._recent
        if not recent:
            return Rolling(None, None, None, None)
        times = sorted(s.step_time_s for s in recent)
        steps_per_s, examples_per_s = self._rates()
        return Rolling(
            step_p50_s=percentile(times, 50),
            step_p95_s=percentile(times, 95),
            steps_per_s=steps_per_s,
            examples_per_s=examples_per_s,
        )

    def _rates(self) -> tuple[float | None, float | None]:
        rate = self._rate
        if len(rate) < 2:
            # One record: its own step time is the best estimate of the rate.
            last = self.last
            if last is not None and last.step_time_s > 0:
                sps = 1.0 / last.step_time_s
                return sps, (sps * self._batch if self._batch is not None else None)
            return None, None
        t_end, step_end, ex_end = rate[-1]
        # Drop records older than the window, but keep two to measure between.
        while len(rate) > 2 and rate[0][0] < t_end - self.rate_window_s:
            rate.popleft()
        t0, step0, ex0 = rate[0]
        dt = t_end - t0
        if dt <= 0:
            return None, None
        sps = (step_end - step0) / dt
        eps = (ex_end - ex0) / dt if self._batch is not None else None
        return sps, eps


class RunSteps:
    """Every step time of a run, for exact whole-run percentiles (8 bytes a record), and the
    second and last step records for the run's speed: from the end of the first step, which
    traces and compiles, to the end of the last. The figures of a finished run wherever they are
    shown: ``tpuwatch report``, ``compare`` and the end-of-run summary of ``run --headless``."""

    def __init__(self, on_step: Callable[[Step], None] | None = None) -> None:
        self.values = array("d")
        self.first: Step | None = None
        self.last: Step | None = None
        self.on_step = on_step
        # examples from the second record on (the span of steps_per_s); a record without its
        # examples (paced reads) counts at the last known batch, never as zero
        self.examples = 0
        self._batch: int | None = None

    def add(self, m: Step) -> None:
        self.values.append(m.step_time_s)
        if m.examples is not None:
            self._batch = m.examples
        if self.first is None and len(self.values) == 2:
            self.first = m
        if self.first is not None and self._batch is not None:
            self.examples += self._batch * m.steps
        self.last = m
        if self.on_step is not None:
            self.on_step(m)

    def tap(self, messages: Iterable[Message]) -> Iterator[Message]:
        """Passes ``messages`` through, noting each step record."""
        for m in messages:
            if type(m) is Step:
                self.add(m)
            yield m

    def steps_per_s(self) -> float | None:
        first, last = self.first, self.last
        if first is None or last is None:
            return None
        span = last.t - (first.t - first.step_time_s * first.steps)
        return (last.step - first.step + first.steps) / span if span > 0 else None

    def examples_per_s(self) -> float | None:
        """Examples a second over the span of :meth:`steps_per_s` (None when no record carried
        its examples)."""
        first, last = self.first, self.last
        if first is None or last is None or self._batch is None:
            return None
        span = last.t - (first.t - first.step_time_s * first.steps)
        return self.examples / span if span > 0 else None

    def percentiles(self) -> tuple[float | None, float | None]:
        if not self.values:
            return None, None
        s = sorted(self.values)
        return percentile(s, 50), percentile(s, 95)

"""``loss-nonfinite`` and ``replica-loss-skew``: what the per-replica losses say."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence, TypeAlias, cast

from tpuwatch.figures import quantile
from tpuwatch.protocol import Finding, Message, Step, StepLoss

from .robust_stats import sig
from .rule import Rule
from .telemetry import Telemetry, Worker
from .thresholds import Thresholds

_MAX_VALUES_PER_CHECK = 16384


def _fmt(v: float) -> str:
    return "nan" if v != v else ("inf" if v > 0 else "-inf")


@dataclass(frozen=True)
class Departure:
    """One replica's loss far from the others' on the steps just before a non-finite loss."""

    column: int  # index into the row (local replica on one worker)
    ratio: float  # largest factor between its |loss| and the others' median over the departed steps
    higher: bool  # above the others (else below: a loss of 0 on garbage data, for example)
    value: float  # its loss on the last finite step
    others: float  # the others' median on that step
    from_step: int
    last_step: int  # the last finite step before the loss went non-finite

    def describe(self) -> str:
        """``"10^6x the others'"``, ``"0 against the others' 0.51"``."""
        if self.higher:
            return f"{times(self.ratio)} the others'"
        if self.value == 0:
            return f"0 against the others' {self.others:.2g}"
        return f"{times(self.ratio)} below the others'"


Rows: TypeAlias = "deque[tuple[int, tuple[float, ...]]] | list[tuple[int, tuple[float, ...]]]"


def departure(rows: Rows, min_ratio: float) -> Departure | None:
    """The replica that left the others (loss >= ``min_ratio`` x the others' median, or, with
    three replicas or more, as many times below) on the latest rows ``(step, per-replica
    losses)``, and the step from which it did; None if no replica did."""
    if not rows:
        return None
    last = rows[-1][1]
    n = len(last)
    if n < 2:
        return None

    def factor(row: tuple[float, ...], r: int) -> tuple[float, bool, float]:
        others = sorted(abs(v) for i, v in enumerate(row) if i != r)
        ref = _median_sorted(others)
        a = abs(row[r])
        up = a / ref if ref > 0 else (math.inf if a else 1.0)
        down = ref / a if a > 0 else (math.inf if ref else 1.0)
        if n < 3 or up >= down:  # with two replicas only "higher" says which one is off
            return up, True, ref
        return down, False, ref

    col = max(range(n), key=lambda r: factor(last, r)[0])
    ratio, higher, ref = factor(last, col)
    if ratio < min_ratio:
        return None
    from_step, worst = rows[-1][0], 0.0
    for step, row in reversed(rows):
        if len(row) != n:
            break
        rr, hh, _ = factor(row, col)
        if rr < min_ratio or hh != higher:
            break
        from_step, worst = step, max(worst, rr)
    return Departure(col, worst, higher, last[col], ref, from_step, rows[-1][0])


def times(ratio: float) -> str:
    """``1.2e6`` -> ``"10^6x"``, ``35`` -> ``"35x"``."""
    if not math.isfinite(ratio):
        return "infinitely many times"
    if ratio >= 1000:
        return f"10^{int(math.floor(math.log10(ratio)))}x"
    return f"{ratio:.2g}x"


@dataclass
class NonFinite:
    first_step: int
    first_t: float
    replica: int | None  # global index of the first bad replica; None: only the mean was bad
    device: str
    value: str
    bad_replicas: set[int] = field(default_factory=set)
    steps: int = 0
    last_step: int = 0
    origin: Departure | None = None
    origin_replica: int | None = None
    origin_device: str = ""
    together: set[int] = field(default_factory=set)  # replicas bad at the first bad step
    replicas: int = 0  # this worker's replicas at the first bad step
    #: The last step before first_step whose losses were read, all finite, where the steps between
    #: them went unseen: it went non-finite between the two.
    last_finite: int | None = None
    #: Records between them were not read (the agent reads some only); else one call ran those
    #: steps (steps_per_execution, a loop inside the step), and only its last step's loss is seen.
    unread: bool = False


class LossNonfinite(Rule):
    """NaN or Inf in the loss of any replica (or the mean). Critical at once: it never heals."""

    id = "loss-nonfinite"
    #: StepLoss: the losses of a record sent without them, read when training paused (an epoch's
    #: or the run's end, evaluation): the only read of its step
    observes = (Step, StepLoss)

    def __init__(self, th: Thresholds) -> None:
        super().__init__(th)
        self.bad: dict[str, NonFinite] = {}
        #: worker -> the latest finite per-replica rows, to find where a non-finite loss began
        self.recent: dict[str, deque[tuple[int, tuple[float, ...]]]] = {}

    def observe(self, msg: Message, w: Worker, tel: Telemetry) -> None:
        msg = cast("Step | StepLoss", msg)  # observes = (Step, StepLoss)
        loss, rl = msg.loss, msg.replica_losses
        # sum() of finite values is finite; NaN or Inf anywhere makes it non-finite (fast path)
        if (loss is None or math.isfinite(loss)) and (not rl or math.isfinite(sum(rl))):
            if rl and w.name not in self.bad:
                ring = self.recent.get(w.name)
                if ring is None:
                    ring = self.recent[w.name] = deque(maxlen=self.th.skew_origin_lookback)
                ring.append((msg.step, rl))
            return
        off = w.replica_offset()
        bad_idx = [i for i, v in enumerate(rl) if not math.isfinite(v)]
        nf = self.bad.get(w.name)
        if nf is None:
            if bad_idx:
                i = bad_idx[0]
                nf = NonFinite(msg.step, msg.t, off + i, w.device_of(i), _fmt(rl[i]))
            else:
                nf = NonFinite(msg.step, msg.t, None, "", _fmt(loss if loss is not None else math.nan))
            recent = self.recent.pop(w.name, None)
            last_read = recent[-1][0] if recent else 0
            if msg.step - last_read > 1:
                nf.last_finite = last_read
                nf.unread = msg.step - (msg.steps if isinstance(msg, Step) else 1) > last_read
            dep = departure(recent or [], self.th.skew_origin_ratio)
            if dep is not None:
                nf.origin, nf.origin_replica = dep, off + dep.column
                nf.origin_device = w.device_of(dep.column)
            nf.together = {off + i for i in bad_idx}
            nf.replicas = len(rl)
            self.bad[w.name] = nf
        nf.bad_replicas.update(off + i for i in bad_idx)
        nf.steps += 1
        nf.last_step = msg.step

    def check(self, tel: Telemetry) -> None:
        for name, nf in self.bad.items():
            at_once = nf.replicas > 1 and len(nf.together) == nf.replicas
            where = (f"all {nf.replicas} replicas" if at_once
                     else f"replica {nf.replica}" + (f" ({nf.device})" if nf.device else "")
                     if nf.replica is not None else "the mean loss")
            others = sorted(nf.bad_replicas - (nf.together if at_once else {nf.replica}))
            also = (f"; later also replica{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}"
                    if others else "")
            dep = nf.origin
            origin = look = ""
            if dep is not None:
                origin = (f"; it began on replica {nf.origin_replica}, whose loss was "
                          f"{dep.describe()} from step {dep.from_step}")
                look = (f"Replica {nf.origin_replica}'s data from step {dep.from_step} is the first "
                        "suspect (check its input shard for corrupt records); ")
            evidence: dict[str, Any] = {
                "first_step": nf.first_step,
                "replica": "all" if at_once else nf.replica if nf.replica is not None else "mean",
                "device": nf.device,
                "value": nf.value,
                "bad_replicas": ",".join(map(str, sorted(nf.bad_replicas))),
                "nonfinite_records": nf.steps,
            }
            if dep is not None:
                evidence.update(origin_replica=nf.origin_replica, origin_device=nf.origin_device,
                                origin_from_step=dep.from_step, origin_ratio=sig(min(dep.ratio, 1e300), 2))
            when, read, steps = f"from step {nf.first_step}", "", f"step {nf.first_step}"
            if nf.last_finite is not None:
                evidence["last_finite_step"] = nf.last_finite
                when = (f"between step {nf.last_finite} and step {nf.first_step}" if nf.last_finite
                        else f"within its first {nf.first_step} steps")
                steps = f"steps {nf.last_finite + 1}-{nf.first_step}"
                if nf.unread:
                    when += " (the steps between were not read)"
                    read = ("Set TPUWATCH_LOSS_EVERY_S=0 to read the losses after every step call and see "
                            "the call, and the replica, it began in. ")
                else:
                    when += " (one call ran them: only its last step's loss is seen)"
            self._keep(name, Finding(
                t=nf.first_t, rule=self.id, severity="critical",
                message=f"loss is {nf.value} on {where} {when}{also}{origin}",
                advice=look + read + (f"Look at {steps} on {where}: lower the learning rate or add "
                        "gradient clipping (clipnorm); check that batch's data for NaN/Inf or "
                        "empty inputs (tf.debugging.check_numerics, "
                        "tf.debugging.enable_check_numerics()); with float16 use loss "
                        "scaling (LossScaleOptimizer) or bfloat16; guard log/div/sqrt with epsilons"),
                evidence=evidence,
                first_step=nf.first_step, last_step=nf.last_step, worker=name,
            ))


class ReplicaLossSkew(Rule):
    """One replica's loss persistently above or below the others at the same steps.

    Per step, each replica's gap to the median of all replicas; over the window, the
    mean gap must be large in absolute terms, relative to the loss, and relative to its own
    standard error over time (a z-score over many steps), with a consistent sign. Needs three
    or more replicas (with two there is no telling which one is off), finite losses, and 16 steps
    read, spread over 50 of the run's (the agent does not read every step's losses).
    """

    id = "replica-loss-skew"
    observes = (Step, StepLoss)  # StepLoss: see LossNonfinite

    def __init__(self, th: Thresholds) -> None:
        super().__init__(th)
        self.rings: dict[str, deque[tuple[int, tuple[float, ...]]]] = {}
        self._went_nonfinite: set[str] = set()

    def observe(self, msg: Message, w: Worker, tel: Telemetry) -> None:
        msg = cast("Step | StepLoss", msg)  # observes = (Step, StepLoss)
        rl = msg.replica_losses
        if rl:
            ring = self.rings.get(w.name)
            if ring is None:
                ring = self.rings[w.name] = deque(maxlen=self.th.skew_window_steps)
            if w.name not in self._went_nonfinite and not math.isfinite(sum(rl)):
                self._went_nonfinite.add(w.name)
                self._before_nonfinite(w, ring, msg.step)
            ring.append((msg.step, rl))

    def _before_nonfinite(self, w: Worker, ring: deque[tuple[int, tuple[float, ...]]], step: int) -> None:
        """The steps before a non-finite loss: one replica that departed from the others is
        its origin, however few steps the run has (no 50-step window needed)."""
        rows = [r for r in list(ring)[-self.th.skew_origin_lookback:] if math.isfinite(sum(r[1]))]
        dep = departure(rows, self.th.skew_origin_ratio)
        if dep is None:
            return
        rep = w.replica_offset() + dep.column
        dev = w.device_of(dep.column)
        self._keep(f"replica{rep}", Finding(
            t=w.last_step_t or 0.0, rule=self.id, severity="warning",
            message=(f"replica {rep}{' (' + dev + ')' if dev else ''}'s loss was {dep.describe()} "
                     f"from step {dep.from_step}; the loss went non-finite at step {step}"),
            advice=(f"Replica {rep}'s input from step {dep.from_step} is the likely origin of the "
                    "non-finite loss: look for corrupt records (NaN/Inf, unnormalised or blank "
                    "inputs, wrong labels) in the shard it reads (tf.debugging.check_numerics on "
                    "the batch), and check the input sharding (AutoShardPolicy DATA vs FILE)"),
            evidence={
                "replica": rep,
                "device": dev,
                "loss_ratio_to_others": sig(min(dep.ratio, 1e300), 2),
                "direction": "higher" if dep.higher else "lower",
                "from_step": dep.from_step,
                "nonfinite_step": step,
                "window_steps": len(rows),
                "origin_ratio_threshold": self.th.skew_origin_ratio,
            },
            first_step=dep.from_step, last_step=dep.last_step, worker=w.name,
        ))

    def _aligned(self, tel: Telemetry
                 ) -> tuple[list[int], list[Sequence[float]], list[tuple[str, int, int]]]:
        """Steps every worker reported (all finite), the rows of all replicas' losses at them,
        and per column (worker, global replica, local index)."""
        workers = sorted((tel.workers[n] for n in self.rings if n in tel.workers),
                         key=lambda w: (w.replica_offset(), w.name))
        if not workers:
            return [], [], []
        if len(workers) == 1:  # the common case: no alignment needed
            w = workers[0]
            ring = self.rings[w.name]
            width = len(ring[-1][1])
            steps: list[int] = []
            rows: list[Sequence[float]] = []
            for s, row in ring:
                if len(row) == width and math.isfinite(sum(row)):
                    steps.append(s)
                    rows.append(row)
            return steps, rows, [(w.name, w.replica_offset() + i, i) for i in range(width)]
        by_worker = [dict(self.rings[w.name]) for w in workers]
        widths = {}
        for w, d in zip(workers, by_worker):
            sizes = {len(v) for v in d.values()}
            if len(sizes) != 1:  # replica count changed mid-window: use the latest width only
                last = len(next(reversed(d.values())))
                for k in [k for k, v in d.items() if len(v) != last]:
                    del d[k]
                sizes = {last}
            widths[w.name] = sizes.pop()
        common = set(by_worker[0])
        for d in by_worker[1:]:
            common &= set(d)
        cols = [(w.name, w.replica_offset() + i, i) for w in workers for i in range(widths[w.name])]
        steps, rows = [], []
        for s in sorted(common):
            merged = [v for d in by_worker for v in d[s]]
            if math.isfinite(sum(merged)):
                steps.append(s)
                rows.append(merged)
        return steps, rows, cols

    def check(self, tel: Telemetry) -> None:
        th = self.th
        steps, rows, cols = self._aligned(tel)
        n_rep = len(cols)
        # bound the work on big jobs (16k losses per check): the latest steps matter most
        keep = max(th.skew_min_steps, _MAX_VALUES_PER_CHECK // max(n_rep, 1))
        if len(rows) > keep:
            steps, rows = steps[-keep:], rows[-keep:]
        if n_rep < 3 or len(rows) < th.skew_min_reads or steps[-1] - steps[0] + 1 < th.skew_min_steps:
            return
        middle = (steps[0] + steps[-1]) / 2
        early = sum(1 for s in steps if s <= middle)
        if min(early, len(steps) - early) < th.skew_min_reads // 4:  # most reads in a few steps
            return
        n = len(rows)
        gaps = [[0.0] * n for _ in range(n_rep)]
        scales = []
        for si, row in enumerate(rows):
            # the reference is the median of all replicas: with three, the median of the
            # "other two" would be dragged half way by the odd one and flag the healthy ones
            center = _median_sorted(sorted(row))
            scales.append(abs(center))
            for r, v in enumerate(row):
                gaps[r][si] = v - center
        scale = sorted(scales)[n // 2]
        for r in range(n_rep):
            d = gaps[r]
            mean = sum(d) / n
            var = sum((x - mean) ** 2 for x in d) / (n - 1)
            se = math.sqrt(var / n)
            z = abs(mean) / se if se > 0 else (math.inf if mean else 0.0)
            rel = abs(mean) / scale if scale > 0 else math.inf
            same = sum(1 for x in d if x * mean > 0) / n
            if (abs(mean) < th.skew_min_abs_gap or rel < th.skew_min_rel_gap or z < th.skew_min_z
                    or same < th.skew_min_same_sign):
                continue
            worker, rep, local = cols[r]
            w = tel.workers[worker]
            dev = w.device_of(local)
            direction = "higher" if mean > 0 else "lower"
            self._keep(f"replica{rep}", Finding(
                t=w.last_step_t or 0.0, rule=self.id, severity="warning",
                message=(f"replica {rep}{' (' + dev + ')' if dev else ''} loss is "
                         f"{round(100 * rel)}% {direction} than the replicas' median, "
                         "persistently"),
                advice=(f"Replica {rep} sees different data: check the input sharding "
                        "(tf.data.experimental.AutoShardPolicy: DATA vs FILE - with FILE, uneven "
                        "or class-sorted files give skewed shards), shuffle before sharding, and "
                        "make sure every file/shard holds a similar mix of examples"),
                evidence={
                    "replica": rep,
                    "device": dev,
                    "mean_gap": sig(mean),
                    "relative_gap_pct": round(100 * rel),
                    "z_score": sig(min(z, 1e6), 2),
                    "same_sign_pct": round(100 * same),
                    "loss_scale": sig(scale),
                    "window_steps": n,
                    "replicas": n_rep,
                },
                first_step=steps[0], last_step=steps[-1],
                worker=worker,
            ))


def _median_sorted(s: list[float]) -> float:
    return quantile(s, 0.5)  # the one median (robust_stats): the two middle values averaged


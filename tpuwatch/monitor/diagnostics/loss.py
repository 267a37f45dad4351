"""``loss-nonfinite`` and ``replica-loss-skew``: what the per-replica losses say."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from tpuwatch.protocol import Finding, Message, Step

from .robust_stats import sig
from .rule import Rule
from .telemetry import Telemetry, WorkerTelemetry


_MAX_VALUES_PER_CHECK = 16384


def _fmt(v: float) -> str:
    return "nan" if v != v else ("inf" if v > 0 else "-inf")


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


class LossNonfinite(Rule):
    """NaN or Inf in the loss of any replica (or the mean). Critical at once: it never heals."""

    id = "loss-nonfinite"
    observes = (Step,)

    def __init__(self, th) -> None:
        super().__init__(th)
        self.bad: dict[str, NonFinite] = {}

    def observe(self, msg: Message, w: WorkerTelemetry, tel: Telemetry) -> None:
        loss, rl = msg.loss, msg.replica_losses  # type: ignore[attr-defined]
        # sum() of finite values is finite; NaN or Inf anywhere makes it non-finite (fast path)
        if (loss is None or math.isfinite(loss)) and (not rl or math.isfinite(sum(rl))):
            return
        off = w.replica_offset()
        bad_idx = [i for i, v in enumerate(rl) if not math.isfinite(v)]
        nf = self.bad.get(w.name)
        if nf is None:
            if bad_idx:
                i = bad_idx[0]
                nf = NonFinite(msg.step, msg.t, off + i, w.device_of(i), _fmt(rl[i]))
            else:
                nf = NonFinite(msg.step, msg.t, None, "", _fmt(loss))
            self.bad[w.name] = nf
        nf.bad_replicas.update(off + i for i in bad_idx)
        nf.steps += 1
        nf.last_step = msg.step

    def check(self, tel: Telemetry) -> None:
        for name, nf in self.bad.items():
            where = (f"replica {nf.replica}" + (f" ({nf.device})" if nf.device else "")
                     if nf.replica is not None else "the mean loss")
            others = sorted(nf.bad_replicas - {nf.replica})
            also = f"; later also replicas {', '.join(map(str, others))}" if others else ""
            self._keep(name, Finding(
                t=nf.first_t, rule=self.id, severity="critical",
                message=f"loss is {nf.value} on {where} from step {nf.first_step}{also}",
                advice=(f"Look at step {nf.first_step} on {where}: lower the learning rate or add "
                        "gradient clipping (clipnorm); check that batch's data for NaN/Inf or "
                        "empty inputs (tf.debugging.check_numerics, "
                        "tf.debugging.enable_check_numerics()); with float16 use loss "
                        "scaling (LossScaleOptimizer) or bfloat16; guard log/div/sqrt with epsilons"),
                evidence={
                    "first_step": nf.first_step,
                    "replica": nf.replica if nf.replica is not None else "mean",
                    "device": nf.device,
                    "value": nf.value,
                    "bad_replicas": ",".join(map(str, sorted(nf.bad_replicas))),
                    "nonfinite_records": nf.steps,
                },
                first_step=nf.first_step, last_step=nf.last_step, worker=name,
            ))


class ReplicaLossSkew(Rule):
    """One replica's loss persistently above or below the others at the same steps.

    Per step, each replica's gap to the median of all replicas; over the window, the
    mean gap must be large in absolute terms, relative to the loss, and relative to its own
    standard error over time (a z-score over many steps), with a consistent sign. Needs three
    or more replicas (with two there is no telling which one is off) and finite losses.
    """

    id = "replica-loss-skew"
    observes = (Step,)

    def __init__(self, th) -> None:
        super().__init__(th)
        self.rings: dict[str, deque] = {}

    def observe(self, msg: Message, w: WorkerTelemetry, tel: Telemetry) -> None:
        rl = msg.replica_losses  # type: ignore[attr-defined]
        if rl:
            ring = self.rings.get(w.name)
            if ring is None:
                ring = self.rings[w.name] = deque(maxlen=self.th.skew_window_steps)
            ring.append((msg.step, rl))  # type: ignore[attr-defined]

    def _aligned(self, tel: Telemetry
                 ) -> tuple[list[int], list[list[float]], list[tuple[str, int, int]]]:
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
            steps, rows = [], []
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
            row = [v for d in by_worker for v in d[s]]
            if math.isfinite(sum(row)):
                steps.append(s)
                rows.append(row)
        return steps, rows, cols

    def check(self, tel: Telemetry) -> None:
        th = self.th
        steps, rows, cols = self._aligned(tel)
        n_rep = len(cols)
        # bound the work on big jobs (16k losses per check): the latest steps matter most
        keep = max(th.skew_min_steps, _MAX_VALUES_PER_CHECK // max(n_rep, 1))
        if len(rows) > keep:
            steps, rows = steps[-keep:], rows[-keep:]
        if n_rep < 3 or len(rows) < th.skew_min_steps:
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
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


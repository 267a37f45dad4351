"""``straggler-host``: one worker of a multi-worker job slower than the others."""

from __future__ import annotations

from bisect import bisect_left

from tpuwatch.protocol import Finding
from tpuwatch.units import finding_ms

from .robust_stats import mad, median, sig
from .rule import Rule
from .telemetry import Telemetry

_METRICS = (("input_wait", "input wait"), ("step_time", "step time"))


class StragglerHost(Rule):
    """A worker whose median step time or input wait stands out from the other workers'.

    Three or more workers: above median + 3 x MAD across workers (MAD floored at 5% of the
    median). Two workers: the slower at least 1.5x the faster. Always with an absolute floor
    (5 ms, and 10% of the median step time) so scheduling noise never makes a straggler. In
    synchronous training all step times equalise (everyone waits for the slowest in the
    all-reduce), so input wait is usually the telling metric.
    """

    id = "straggler-host"

    def check(self, tel: Telemetry) -> None:
        th = self.th
        stats: dict[str, dict[str, float]] = {}
        self._span: dict[str, tuple[int, int, float]] = {}  # worker -> first, last step, t
        for w in tel.step_workers():
            recs = list(w.window)
            # steps, not records: a record of a summary stream is an interval of many steps
            if sum(r[4] for r in recs) < th.straggler_min_records:
                continue
            self._span[w.name] = (recs[0][0], recs[-1][0], recs[-1][1])
            s = {"step_time": median([r[2] for r in recs])}
            waits = [r for r in recs if r[3] is not None]
            if sum(r[4] for r in waits) >= th.straggler_min_records:
                s["input_wait"] = median([float(r[3] or 0.0) for r in waits])
            stats[w.name] = s
        if len(stats) < 2:
            return
        step_med = median([s["step_time"] for s in stats.values()])
        for metric, label in _METRICS:
            vals = {n: s[metric] for n, s in stats.items() if metric in s}
            if len(vals) < 2:
                continue
            self._check_metric(metric, label, vals, step_med)

    def _check_metric(self, metric: str, label: str, vals: dict[str, float],
                      step_med: float) -> None:
        th = self.th
        floor = max(th.straggler_min_excess_s, th.straggler_min_excess_frac * step_med)
        ordered = sorted(vals.values())  # once: a pod has a thousand workers
        allv = list(vals.values())
        center = median(allv)
        spread = max(mad(allv, center), th.straggler_min_mad_frac * center)
        for name, v in vals.items():
            ref = _median_without(ordered, bisect_left(ordered, v))
            excess = v - ref
            if excess < floor:
                continue
            if len(vals) == 2:
                if v < th.straggler_pair_ratio * ref:
                    continue
                how = f"{th.straggler_pair_ratio:g}x the other worker"
            else:
                if v <= center + th.straggler_mad_factor * spread:
                    continue
                how = f"median + {th.straggler_mad_factor:g} x MAD across workers"
            first, last, t = self._span[name]
            self._keep(f"{name}|{metric}", Finding(
                t=t, rule=self.id, severity="warning",
                message=(f"straggler: worker {name} median {label} {finding_ms(v)} vs "
                         f"{finding_ms(ref)} on the other workers (+{finding_ms(excess)})"),
                advice=(f"Look at host {name.split(':')[0]}: "
                        + ("its input pipeline is slower - uneven shards/files, slower disk or "
                           "network to the data, fewer CPU cores or other load; balance the "
                           "shards and give tf.data parallelism" if metric == "input_wait" else
                           "it computes slower - other processes on it, thermal/clock issues, "
                           "a different accelerator or driver; compare its load")
                        + "; in synchronous training every worker waits for it"),
                evidence={
                    "straggler_worker": name,
                    "metric": metric,
                    f"{metric}_ms": sig(v * 1000, 2),
                    f"others_{metric}_ms": sig(ref * 1000, 2),
                    "excess_ms": sig(excess * 1000, 2),
                    "workers": len(vals),
                    "rule": how,
                },
                first_step=first, last_step=last, worker=name,
            ))


def _median_without(ordered: list[float], i: int) -> float:
    """The median (two middle values averaged) of sorted ``ordered`` without its ``i``-th value."""
    m = len(ordered) - 1

    def at(j: int) -> float:
        return ordered[j] if j < i else ordered[j + 1]

    return at(m // 2) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2

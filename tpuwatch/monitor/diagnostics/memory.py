"""``host-memory-growth`` and ``device-memory-headroom``."""

from __future__ import annotations

import dataclasses
import re

from tpuwatch.protocol import SEVERITY_RANK, AllocationSites, Finding, Severity

from .robust_stats import sig, theil_sen
from .rule import Rule
from .telemetry import Telemetry, Worker
from .thresholds import Thresholds

MB = 1 << 20
_MAX_FIT_POINTS = 60  # Theil-Sen is O(n^2): thin the window to this many points
_HOLD_SLACK = 1.25  # growth up to this times what the pipeline holds (+ the growth floor) is it
_LATE_SHARE = 0.25  # of a window's growth, at least, in its latest half for a leak


ADVICE = ("Something is kept per step: lists of tensors or arrays appended every "
          "step (loss histories of tensors, .numpy() results, model outputs), "
          "growing Python dicts/caches, or tf.functions/datasets created per step. "
          "Keep Python floats (float(loss)) or aggregate with a Keras metric; "
          "clear per-epoch lists")


class HostMemoryGrowth(Rule):
    """A steady climb of host RSS, fitted against time (over minutes) and against steps.

    Robust slopes (Theil-Sen) plus the share of increasing point pairs, so a one-off step up
    (a cache filled, a checkpoint buffer) or a sawtooth (GC) does not read as a leak.

    - Against time: bucketed RSS points over the latest 10 minutes, after a 60 s warm-up.
    - Against steps: RSS at each host sample with its step, after the first steps; this
      answers within a short run (2 MiB per step over 400 steps is a leak in 4 s).

    Both skip the first epoch when the run reports epochs (``dataset.cache()`` fills during
    epoch 0), unless the pipeline map bounds what its stages hold in memory. The time to
    exhaustion projects the slope (per second) onto the available host memory; under 30
    minutes is critical whatever the run's length. Growth between samples with a trace between
    them is left out (the retrace finding shows it); growth within what the pipeline's caches
    and shuffle buffers hold is an info; the leak doctor's allocation sites name the line. The
    kept finding's figures are kept with it: sites that arrive later rewrite it with the line,
    even when no later fit reports (the rate slowed while the window sampled) or one reports a
    lower severity (which :meth:`_keep` does not take).
    """

    id = "host-memory-growth"

    def __init__(self, th: Thresholds) -> None:
        super().__init__(th)
        # worker -> (the last point analysed, the leak doctor's sites then): sites that arrive
        # after the last point (a window that closed as the run ended) are news too
        self._checked_at: dict[str, tuple[float, AllocationSites | None]] = {}
        self._steps_checked_at: dict[str, tuple[int, AllocationSites | None]] = {}
        # worker -> the figures of the finding kept and the sites it was written with: sites that
        # arrive later name its line even when no later fit reports (the rate slowed under the
        # window's cost, or a refit's severity is below the kept one)
        self._basis: dict[str, tuple[_Fit, AllocationSites | None]] = {}

    def _analysis_start(self, w: Worker) -> float | None:
        th = self.th
        if w.rss_first_t is None:
            return None
        start = w.rss_first_t + th.rss_warmup_s
        if w.first_step_t is not None:
            start = max(start, w.first_step_t)
        if w.epoch_begin_seen and _may_fill(w):
            if w.first_epoch_end_t is not None:
                start = max(start, w.first_epoch_end_t)
            else:
                start = max(start, w.rss_first_t + th.rss_first_epoch_wait_s)
        return start

    def check(self, tel: Telemetry) -> None:
        for w in tel.workers.values():
            # the time fit last: when both see a leak, its numbers (over minutes) are the ones kept
            self._check_steps(w)
            self._check_time(w)
            basis = self._basis.get(w.name)
            if basis is not None and basis[1] is not w.allocations:
                self._basis[w.name] = (basis[0], w.allocations)  # tried once per change of sites
                self._report(w, basis[0])

    def _check_time(self, w: Worker) -> None:
        th = self.th
        start = self._analysis_start(w)
        if start is None:
            return
        if not w.rss_points or _same(self._checked_at.get(w.name), w.rss_points[-1][0], w):
            return  # nothing new since the last check
        self._checked_at[w.name] = (w.rss_points[-1][0], w.allocations)
        sel = [p for p in w.rss_points if p[0] >= start]
        if len(sel) < th.rss_min_points or sel[-1][3] - sel[0][3] < th.rss_min_span_s:
            return  # too short a stretch, the left-out intervals' time not counted
        # growth with traces (the retrace finding's) and automatic captures left out, over the
        # time with them left out
        pts = [(p[3], p[2]) for p in sel]
        slope_bps, up_share = theil_sen(_thin(pts))
        span_s = sel[-1][0] - sel[0][0]
        growth_mb = (pts[-1][1] - pts[0][1]) / MB
        if (slope_bps * 60 / MB < th.rss_warning_mb_per_min or growth_mb < th.rss_min_growth_mb
                or up_share < th.rss_min_increasing_pairs or _levels_off(pts)):
            return
        self._report(w, _Fit(sel[-1][0], sel[-1][1], slope_bps, up_share, growth_mb,
                             f"over {span_s / 60:.2g} min", {"window_min": sig(span_s / 60, 2)}, None,
                             w.available_bytes))

    def _check_steps(self, w: Worker) -> None:
        th = self.th
        pts = w.rss_step_points
        if not pts or _same(self._steps_checked_at.get(w.name), pts[-1][0], w):
            return
        self._steps_checked_at[w.name] = (pts[-1][0], w.allocations)
        first = th.rss_warmup_steps
        if w.epoch_begin_seen and _may_fill(w):
            if w.epoch_end_steps:
                first = max(first, w.epoch_end_steps[0])
            elif w.rss_first_t is None or pts[-1][1] - w.rss_first_t < th.rss_first_epoch_wait_s:
                return  # still in the first epoch: the cache may be filling
        sel = [p for p in pts if p[0] > first]
        if len(sel) < th.rss_min_step_points or sel[-1][4] - sel[0][4] < th.rss_min_span_steps:
            return
        # RSS with the growth between samples that saw a trace (traced graphs) or an automatic
        # capture (the profiler's buffers) left out, against the steps with theirs left out
        per_step, up_share = theil_sen(_thin([(p[4], p[3]) for p in sel]))
        growth_mb = (sel[-1][3] - sel[0][3]) / MB
        span_s = sel[-1][1] - sel[0][1]
        if growth_mb < th.rss_min_growth_mb or up_share < th.rss_min_increasing_pairs or per_step <= 0:
            return
        if span_s <= 0:
            return
        by_time = [(p[5], p[3]) for p in sel]
        slope_bps, _ = theil_sen(_thin(by_time))
        # a leak climbs at the same pace to the end; a warm-up (pools, caches) levels off:
        # the latest half must climb too, at least half as fast as the whole
        late_bps, _ = theil_sen(_thin(by_time[len(by_time) // 2:]))
        if (slope_bps * 60 / MB < th.rss_warning_mb_per_min
                or late_bps * 60 / MB < th.rss_warning_mb_per_min or late_bps < 0.5 * slope_bps
                or _levels_off(by_time)):
            return
        available = w.available_bytes
        if growth_mb < th.rss_min_step_growth_mb and (
                available is None or available / slope_bps >= th.rss_critical_exhaust_s):
            return  # as much as a warm-up climbs, unless memory runs out soon at its pace
        steps = sel[-1][0] - sel[0][0]
        self._report(w, _Fit(sel[-1][1], sel[-1][2], slope_bps, up_share, growth_mb, None,
                             {"mib_per_step": sig(per_step / MB, 2), "window_steps": steps,
                              "window_s": sig(span_s, 2)}, per_step, w.available_bytes))

    def _report(self, w: Worker, fit: _Fit) -> None:
        f = self._compose(w, fit)
        kept = self._found.get(w.name)
        if kept is None or SEVERITY_RANK[f.severity] >= SEVERITY_RANK[kept.severity]:
            self._basis[w.name] = (fit, w.allocations)
        self._keep(w.name, f)

    def _compose(self, w: Worker, fit: _Fit) -> Finding:
        t, rss, slope_bps, up_share, growth_mb = fit.t, fit.rss, fit.slope_bps, fit.up_share, fit.growth_mb
        scope, extra, per_step, available = fit.scope, fit.extra, fit.per_step, fit.available_bytes
        th = self.th
        mb_per_min = slope_bps * 60 / MB
        exhaust_s = (available / slope_bps if available is not None and slope_bps > 0 else None)
        severity: Severity = ("critical" if exhaust_s is not None and exhaust_s < th.rss_critical_exhaust_s
                    else "warning")
        evidence: dict[str, float | int | str] = {
            "slope_mb_per_min": sig(mb_per_min, 2),
            "growth_mb": sig(growth_mb, 2),
            **extra,
            "increasing_pairs_pct": round(100 * up_share),
            "rss_mb": sig(rss / MB, 3),
            "warning_threshold_mb_per_min": th.rss_warning_mb_per_min,
        }
        tail = ""
        if exhaust_s is not None:
            evidence["available_mb"] = sig((available or 0) / MB, 3)  # known: exhaust_s needs it
            evidence["minutes_to_exhaustion"] = sig(exhaust_s / 60, 2)
            tail = f"; host memory runs out in ~{_when(exhaust_s)} at this rate"
        rate = (f"+{per_step / MB:.2g} MiB per step, " if per_step is not None else "")
        held = _held_by_pipeline(w)
        if held is not None:
            bound, where = held
            grown = w.rss_untraced - w.rss_step_points[0][3]
            if grown <= _HOLD_SLACK * bound + th.rss_min_growth_mb * MB:
                # the pipeline's own buffers filling (a cache's first pass, a shuffle buffer):
                # expected while within what they hold; a leak beyond that is still a warning
                evidence.update({"held_by_pipeline_mb": sig(bound / MB, 3),
                                 "grown_since_first_step_mb": sig(grown / MB, 3), "held_by": where})
                return Finding(
                    t=t, rule=self.id, severity="info",
                    message=(f"host memory grows as the input pipeline fills its in-memory "
                             f"buffers ({where}: up to {bound / MB:.3g} MB): expected, not a leak"),
                    advice=("Nothing to fix while the data fits in host memory. To keep a large "
                            "cache out of RAM, give it a file: .cache(\"/path/to/cache\")"),
                    evidence=evidence, first_step=None, last_step=w.step or None, worker=w.name,
                )
        advice = ADVICE
        where = ""
        a = w.allocations
        if a is not None:
            evidence["leak_window_s"] = sig(a.window_s, 2)
            if a.step_time_inside_s is not None and a.step_time_before_s is not None:
                evidence["leak_window_step_ms"] = sig(a.step_time_inside_s * 1000, 2)
                evidence["step_ms_before_leak_window"] = sig(a.step_time_before_s * 1000, 2)
            if a.sites and a.sites[0]:
                evidence.update(grows_at=a.sites[0], grows_at_mb=sig(a.grown_bytes[0] / MB, 3),
                                grows_at_kind=a.kinds[0], grows_at_code=a.code[0])
                if len(a.sites) > 1:
                    evidence["also_grows_at"] = ", ".join(
                        f"{s} (+{b / MB:.3g} MB)" for s, b in zip(a.sites[1:], a.grown_bytes[1:]) if s)
                where = f"; allocated at {a.sites[0]}"
                what = (f"{a.blocks[0]} {a.kinds[0]} kept alive" if "tensors" in a.kinds[0]
                        else f"{a.kinds[0]} allocations")
                advice = (f"What grows is allocated at {a.sites[0]} ({a.code[0] or 'the line'}): "
                          f"+{a.grown_bytes[0] / MB:.3g} MB of {what} in "
                          f"{a.window_s:.2g} s that were still alive at its end. ")
                fix = leak_fix(a.code[0], a.kinds[0])
                if fix is not None:
                    evidence.update(fix_code_old=a.code[0], fix_code_new=fix[0])
                    advice += f"{fix[1]}: `{fix[0]}`"
                else:
                    advice += ("Keep less there: a float (float(loss)) instead of a tensor or an array, "
                               "a bounded container (collections.deque(maxlen=...)), or clear it per epoch")
            elif a.sites:  # tensors grew, but not the line that keeps them
                evidence.update(tensors_grown_mb=sig(a.grown_bytes[0] / MB, 3), tensors_grown=a.blocks[0])
                advice = (f"{a.blocks[0]} {a.kinds[0]} (+{a.grown_bytes[0] / MB:.3g} MB) created in "
                          f"{a.window_s:.2g} s were still alive at its end; the line that keeps them "
                          "was not found. " + ADVICE)
            elif _native(a, per_step):
                advice = ("The script's Python allocations and its eager tensors did not grow while "
                          f"sampled ({a.window_s:.2g} s, steps {a.step_from}..{a.step_to}, host memory "
                          f"+{(a.rss_grown_bytes or 0) / MB:.3g} MB meanwhile): what grows is native memory "
                          "(graphs, datasets or tf.functions created per step). " + ADVICE)
            else:
                # the window saw too little of the growth to tell (it slowed or paused while sampled)
                seen = "" if a.rss_grown_bytes is None else f", host memory +{a.rss_grown_bytes / MB:.3g} MB"
                advice = (f"The leak doctor's window ({a.window_s:.2g} s, steps {a.step_from}..{a.step_to}{seen}) "
                          "saw too little growth to name its line. " + ADVICE)
        return Finding(
            t=t, rule=self.id, severity=severity,
            # the step fit's message leaves the growth so far to the evidence: it changes at
            # every sample and would re-announce the finding every second
            message=(f"host memory grows steadily: {rate}+{_n(mb_per_min)} MB/min"
                     + (f" (+{growth_mb:.3g} MB {scope})" if scope else "") + where + tail),
            advice=advice, evidence=evidence,
            first_step=None, last_step=w.step or None, worker=w.name,
        )


@dataclasses.dataclass(frozen=True)
class _Fit:
    """One fit's figures, as a finding is written from them."""

    t: float
    rss: int
    slope_bps: float
    up_share: float
    growth_mb: float
    scope: str | None  # the time fit's span in words; None for the fit against steps
    extra: dict[str, float | int | str]
    per_step: float | None
    available_bytes: int | None  # the host's available memory when fitted: the time to exhaustion's


#: Of the growth the step fit expects over a window's steps, at least this share must show in the
#: window's RSS for an empty diff to say "native memory" (the growth went on while it sampled).
_NATIVE_SHARE = 0.5
_NATIVE_MIN_BYTES = 16 * MB


def _native(a: AllocationSites, per_step: float | None) -> bool:
    """An empty diff means native memory only when the window saw steps and the growth went on
    through it (a window of a recording made before ``rss_grown_bytes``: as it always said)."""
    if a.rss_grown_bytes is None:
        return True
    expected = per_step * (a.step_to - a.step_from) if per_step is not None else 0.0
    return a.step_to > a.step_from and a.rss_grown_bytes >= max(_NATIVE_MIN_BYTES, _NATIVE_SHARE * expected)


KEEP_LATEST = 10  # what the proposed edit keeps of a container that grew every step
_APPEND = re.compile(r"^(?P<target>[A-Za-z_][\w.]*)\.append\((?P<arg>.+)\)$")
_STORE = re.compile(r"^(?P<target>[A-Za-z_][\w.]*)\[(?P<key>[^\]]+)\]\s*=\s*(?P<arg>[^=].*)$")


def leak_fix(code: str, kind: str) -> tuple[str, str] | None:
    """(the growing line rewritten, what the rewrite does) for a line that adds to a container
    every step, or None for any other line. Scalar tensors become floats (a loss history);
    anything else is bounded on the same line: a list keeps its latest ``KEEP_LATEST``, a dict
    keyed per step only the latest entry."""
    code = code.split("  #", 1)[0].strip()
    m = _APPEND.match(code)
    if m:
        target, arg = m["target"], m["arg"]
        if kind == "scalar tensors":
            return f"{target}.append(float({arg}))", "keep a Python float instead of the tensor"
        return (f"{target}.append({arg}); del {target}[:-{KEEP_LATEST}]",
                f"keep only the latest {KEEP_LATEST}")
    m = _STORE.match(code)
    if m:
        target, key, arg = m["target"], m["key"], m["arg"]
        if kind == "scalar tensors":
            return f"{target}[{key}] = float({arg})", "keep a Python float instead of the tensor"
        return f"{target}.clear(); {target}[{key}] = {arg}", "keep only the latest entry"
    return None


def _may_fill(w: Worker) -> bool:
    """Whether the first epoch may be a cache filling by an unknown amount: without a pipeline
    map, or with a stage holding data of unknown size. (A known size is judged against.)"""
    return not w.pipelines or any(b < 0 for _, _, b in w.memory_holders)


def _same(checked: tuple[float, AllocationSites | None] | None, last: float, w: Worker) -> bool:
    """True when ``last`` was analysed already, with the sites the worker has now."""
    return checked is not None and checked[0] == last and checked[1] is w.allocations


def _held_by_pipeline(w: Worker) -> tuple[int, str] | None:
    """(bytes, where) the iterated pipelines' caches and shuffle buffers can hold in host memory;
    None when there are none, or one of them has no known bound (a dataset without static
    shapes: its growth is not explained)."""
    holders = w.memory_holders
    if not holders or not w.rss_step_points or any(b < 0 for _, _, b in holders):
        return None
    big = sorted(holders, key=lambda h: -h[2])
    where = ", ".join(f".{stage}() at {site or 'an unknown line'}" for stage, site, _ in big[:3])
    return sum(b for _, _, b in holders), where


def _levels_off(pts: list[tuple[float, int]]) -> bool:
    """The latest half of the window holds less than a quarter of its growth: a fill that has
    levelled off (a cache's first pass, allocator pools), not a leak (which climbs evenly)."""
    total = pts[-1][1] - pts[0][1]
    late = pts[-1][1] - pts[len(pts) // 2][1]
    return total > 0 and late < _LATE_SHARE * total


def _thin(pts: list[tuple[float, int]]) -> list[tuple[float, int]]:
    stride = max(1, -(-len(pts) // _MAX_FIT_POINTS))
    thin = pts[::stride]
    if thin[-1] is not pts[-1]:
        thin.append(pts[-1])
    return thin


def _n(x: float) -> str:
    """2 significant digits without an exponent: ``5321`` -> ``"5300"``, ``11.4`` -> ``"11"``."""
    return f"{sig(x, 2):.0f}" if abs(x) >= 10 else f"{x:.2g}"


def _when(seconds: float) -> str:
    """``75`` -> ``"75 s"``, ``246`` -> ``"4.1 min"``, ``24600`` -> ``"6.8 h"``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 6000:
        return f"{_n(seconds / 60)} min"
    return f"{_n(seconds / 3600)} h"


class DeviceMemoryHeadroom(Rule):
    """Peak device memory close to the device's limit (only where the limit is known)."""

    id = "device-memory-headroom"

    def check(self, tel: Telemetry) -> None:
        th = self.th
        for w in tel.workers.values():
            over = []
            for d in w.devices.values():
                if d.limit_bytes and d.limit_bytes > 0:
                    frac = d.peak_bytes / d.limit_bytes
                    if frac >= th.device_warning_frac:
                        over.append((frac, d, d.limit_bytes))
            if not over:
                continue
            over.sort(key=lambda x: -x[0])
            frac, d, limit = over[0]
            severity: Severity = "critical" if frac >= th.device_critical_frac else "warning"
            pct = round(100 * frac)
            self._keep(w.name, Finding(
                t=d.t, rule=self.id, severity=severity,
                message=(f"device memory peak at {pct}% of the limit on {d.device} "
                         f"({d.peak_bytes / MB:.0f} of {limit / MB:.0f} MiB); "
                         f"{len(over)} device(s) >= {round(100 * th.device_warning_frac)}%"),
                advice=("Leave headroom before an out-of-memory: lower the per-replica batch size, "
                        "use keras.mixed_precision.set_global_policy('mixed_bfloat16') (halves "
                        "activations), rematerialise activations (tf.recompute_grad / "
                        "gradient checkpointing), or shard the model over more devices"),
                evidence={
                    "device": d.device,
                    "peak_mib": round(d.peak_bytes / MB),
                    "limit_mib": round(limit / MB),
                    "peak_pct": pct,
                    "devices_over_threshold": len(over),
                    "source": d.source,
                    "limit_source": d.limit_source,
                    "warning_threshold_pct": round(100 * th.device_warning_frac),
                },
                first_step=None, last_step=w.step or None, worker=w.name,
            ))

"""``host-memory-growth`` and ``device-memory-headroom``."""

from __future__ import annotations

from tpuwatch.protocol import Finding

from .robust_stats import sig, theil_sen
from .rule import Rule
from .telemetry import Telemetry, WorkerTelemetry

MB = 1 << 20
_MAX_FIT_POINTS = 60  # Theil-Sen is O(n^2): thin the window to this many points


class HostMemoryGrowth(Rule):
    """A steady climb of host RSS over minutes, after warm-up.

    Robust slope (Theil-Sen) over the latest window of bucketed RSS points, plus the share of
    increasing point pairs, so a one-off step up (a cache filled, a checkpoint buffer) or a
    sawtooth (GC) does not read as a leak. Growth confined to the first epoch is treated as
    warm-up (``dataset.cache()`` fills during epoch 0) when the run reports epochs.
    """

    id = "host-memory-growth"

    def __init__(self, th) -> None:
        super().__init__(th)
        self._checked_at: dict[str, float] = {}  # worker -> time of the last point analysed

    def _analysis_start(self, w: WorkerTelemetry) -> float | None:
        th = self.th
        if w.rss_first_t is None:
            return None
        start = w.rss_first_t + th.rss_warmup_s
        if w.first_step_t is not None:
            start = max(start, w.first_step_t)
        if w.epoch_begin_seen:
            if w.first_epoch_end_t is not None:
                start = max(start, w.first_epoch_end_t)
            else:
                start = max(start, w.rss_first_t + th.rss_first_epoch_wait_s)
        return start

    def check(self, tel: Telemetry) -> None:
        th = self.th
        for w in tel.workers.values():
            start = self._analysis_start(w)
            if start is None:
                continue
            if not w.rss_points or self._checked_at.get(w.name) == w.rss_points[-1][0]:
                continue  # nothing new since the last check
            self._checked_at[w.name] = w.rss_points[-1][0]
            pts = [p for p in w.rss_points if p[0] >= start]
            if len(pts) < th.rss_min_points or pts[-1][0] - pts[0][0] < th.rss_min_span_s:
                continue
            stride = max(1, -(-len(pts) // _MAX_FIT_POINTS))
            thin = pts[::stride]
            if thin[-1] is not pts[-1]:
                thin.append(pts[-1])
            slope_bps, up_share = theil_sen(thin)
            mb_per_min = slope_bps * 60 / MB
            span_s = pts[-1][0] - pts[0][0]
            growth_mb = (pts[-1][1] - pts[0][1]) / MB
            if (mb_per_min < th.rss_warning_mb_per_min or growth_mb < th.rss_min_growth_mb
                    or up_share < th.rss_min_increasing_pairs):
                continue
            exhaust_s = (w.available_bytes / slope_bps) if w.available_bytes is not None else None
            severity = ("critical" if exhaust_s is not None and exhaust_s < th.rss_critical_exhaust_s
                        else "warning")
            evidence: dict[str, float | int | str] = {
                "slope_mb_per_min": sig(mb_per_min, 2),
                "growth_mb": sig(growth_mb, 2),
                "window_min": sig(span_s / 60, 2),
                "increasing_pairs_pct": round(100 * up_share),
                "rss_mb": sig(pts[-1][1] / MB, 3),
                "warning_threshold_mb_per_min": th.rss_warning_mb_per_min,
            }
            tail = ""
            if exhaust_s is not None:
                evidence["available_mb"] = sig(w.available_bytes / MB, 3)
                evidence["minutes_to_exhaustion"] = sig(exhaust_s / 60, 2)
                tail = f"; host memory runs out in ~{exhaust_s / 60:.2g} min at this rate"
            self._keep(w.name, Finding(
                t=pts[-1][0], rule=self.id, severity=severity,
                message=(f"host memory grows steadily: +{mb_per_min:.2g} MB/min "
                         f"(+{growth_mb:.3g} MB over {span_s / 60:.2g} min){tail}"),
                advice=("Something is kept per step: lists of tensors or arrays appended every "
                        "step (loss histories of tensors, .numpy() results, model outputs), "
                        "growing Python dicts/caches, or tf.functions/datasets created per step. "
                        "Keep Python floats (float(loss)) or aggregate with a Keras metric; "
                        "clear per-epoch lists"),
                evidence=evidence,
                first_step=None, last_step=w.last_step or None, worker=w.name,
            ))


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
                        over.append((frac, d))
            if not over:
                continue
            over.sort(key=lambda x: -x[0])
            frac, d = over[0]
            severity = "critical" if frac >= th.device_critical_frac else "warning"
            pct = round(100 * frac)
            self._keep(w.name, Finding(
                t=d.t, rule=self.id, severity=severity,
                message=(f"device memory peak at {pct}% of the limit on {d.device} "
                         f"({d.peak_bytes / MB:.0f} of {d.limit_bytes / MB:.0f} MiB); "
                         f"{len(over)} device(s) >= {round(100 * th.device_warning_frac)}%"),
                advice=("Leave headroom before an out-of-memory: lower the per-replica batch size, "
                        "use keras.mixed_precision.set_global_policy('mixed_bfloat16') (halves "
                        "activations), rematerialise activations (tf.recompute_grad / "
                        "gradient checkpointing), or shard the model over more devices"),
                evidence={
                    "device": d.device,
                    "peak_mib": round(d.peak_bytes / MB),
                    "limit_mib": round(d.limit_bytes / MB),
                    "peak_pct": pct,
                    "devices_over_threshold": len(over),
                    "source": d.source,
                    "limit_source": d.limit_source,
                    "warning_threshold_pct": round(100 * th.device_warning_frac),
                },
                first_step=None, last_step=w.last_step or None, worker=w.name,
            ))

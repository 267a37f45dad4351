"""``input-bound``: the accelerator waits for the host's input pipeline."""

from __future__ import annotations

from tpuwatch.protocol import Finding, Severity
from tpuwatch.units import finding_ms

from .input_share import InputShare
from .robust_stats import sig
from .rule import Rule
from .telemetry import Telemetry

ADVICE = (
    "Overlap input with compute: end the pipeline with .prefetch(tf.data.AUTOTUNE); "
    "use .map(..., num_parallel_calls=tf.data.AUTOTUNE, deterministic=False); "
    ".cache() after expensive decoding if the data fits; read files with .interleave(..., "
    "num_parallel_calls=tf.data.AUTOTUNE); if the host CPU is saturated, offload "
    "preprocessing to the tf.data service (tf.data.experimental.service). In a custom loop "
    "that fetches eagerly (for x in dist_dataset), call next(iterator) inside the tf.function "
    "step, or use strategy.distribute_datasets_from_function, so the fetch is not host time "
    "between steps."
)


class InputBound(Rule):
    """Share of step time spent waiting for input (the definition in :mod:`.input_share`).

    Judged over the eligible steps of the last 30 s while the run goes on (so the verdict
    follows the pipeline as it is now, and an input-bound hour stays in the findings even if
    the run recovers) and, once the run has ended, over all of its eligible steps: a finished
    run's report judges the whole run. The figures are means (total wait and total step time
    over the steps judged), so the share equals their ratio; the message says so.
    """

    id = "input-bound"

    def check(self, tel: Telemetry) -> None:
        for w in tel.step_workers():
            self._judge(w.name, w.last_step_t or 0.0, *w.input_share())

    def _judge(self, worker: str, t: float, s: InputShare | None, scope: str) -> None:
        th = self.th
        if s is None or s.level not in ("moderate", "high"):
            return
        severity: Severity = "warning" if s.level == "high" else "info"
        pct = round(100 * s.share)
        self._keep(worker, Finding(
            t=t, rule=self.id, severity=severity,
            # no step count in the message: it would re-announce the finding every second
            message=(f"{s.verdict}: {pct}% of step time waiting for input "
                     f"(mean {finding_ms(s.wait_per_step_s)} of {finding_ms(s.step_time_s)} per step {scope})"),
            advice=ADVICE,
            evidence={
                "input_wait_pct": pct,
                "input_wait_ms_per_step": sig(s.wait_per_step_s * 1000),
                "step_time_ms": sig(s.step_time_s * 1000),
                "window_steps": s.steps,
                "scope": scope,
                "info_threshold_pct": round(100 * th.input_info_frac),
                "warning_threshold_pct": round(100 * th.input_warning_frac),
                "min_wait_ms": sig(th.input_min_wait_s * 1000),
            },
            first_step=s.first_step, last_step=s.last_step, worker=worker,
        ))

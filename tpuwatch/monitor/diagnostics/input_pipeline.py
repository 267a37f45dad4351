"""``input-bound``: the accelerator waits for the host's input pipeline."""

from __future__ import annotations

from tpuwatch.protocol import Finding

from .robust_stats import sig
from .rule import Rule
from .units import ms
from .telemetry import Telemetry

ADVICE = (
    "Overlap input with compute: end the pipeline with .prefetch(tf.data.AUTOTUNE); "
    "use .map(..., num_parallel_calls=tf.data.AUTOTUNE, deterministic=False); "
    ".cache() after expensive decoding if the data fits; read files with .interleave(..., "
    "num_parallel_calls=tf.data.AUTOTUNE); if the host CPU is saturated, offload "
    "preprocessing to the tf.data service (tf.data.experimental.service)."
)


class InputBound(Rule):
    """Share of step time spent waiting for input over the latest window of eligible steps.

    Like xprof, the share is total wait over total step time (so a pipeline that stalls every
    tenth step counts), with the single largest wait of the window left out so one slow
    iterator start (shuffle buffer fill) cannot make a window input-bound on its own.
    """

    id = "input-bound"

    def check(self, tel: Telemetry) -> None:
        th = self.th
        for w in tel.step_workers():
            measured = [r for r in w.window if r[3] is not None]
            if len(measured) < th.input_min_records:
                continue
            wait_sum = time_sum = 0.0
            worst = -1.0
            worst_rec = measured[0]
            steps = 0
            for r in measured:
                k = r[4]
                wait_sum += r[3] * k
                time_sum += r[2] * k
                steps += k
                if r[3] > worst:
                    worst, worst_rec = r[3], r
            # leave the single worst step out (a one-off iterator start)
            wk = worst_rec[4]
            wait_sum -= worst_rec[3] * wk
            time_sum -= worst_rec[2] * wk
            steps -= wk
            if time_sum < th.input_min_window_s or steps <= 0:
                continue
            frac = wait_sum / time_sum
            mean_wait = wait_sum / steps
            if frac < th.input_info_frac or mean_wait < th.input_min_wait_s:
                continue
            severity = "warning" if frac >= th.input_warning_frac else "info"
            first, last = measured[0][0], measured[-1][0]
            pct = round(100 * frac)
            self._keep(w.name, Finding(
                t=measured[-1][1], rule=self.id, severity=severity,
                message=(f"input-bound: {pct}% of step time waiting for input "
                         f"({ms(mean_wait)} of {ms(time_sum / steps)} per step)"),
                advice=ADVICE,
                evidence={
                    "input_wait_pct": pct,
                    "input_wait_ms_per_step": sig(mean_wait * 1000),
                    "step_time_ms": sig(time_sum / steps * 1000),
                    "window_steps": steps,
                    "window_s": sig(time_sum),
                    "info_threshold_pct": round(100 * th.input_info_frac),
                    "warning_threshold_pct": round(100 * th.input_warning_frac),
                },
                first_step=first, last_step=last, worker=w.name,
            ))

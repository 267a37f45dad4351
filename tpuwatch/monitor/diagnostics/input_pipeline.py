"""``input-bound``: the accelerator waits for the host's input pipeline."""

from __future__ import annotations

from collections.abc import Iterable

from tpuwatch.protocol import Finding, InputStages, Pipeline, Severity
from tpuwatch.units import finding_ms, percent

from .input_share import InputShare
from .pipeline_doctor import (
    KERAS_STEP_FUNCTIONS,
    MEASURED_MIN_SHARE,
    Culprit,
    culprit,
    measured_stage,
    stage_culprit,
    training_pipeline,
)
from .robust_stats import sig
from .rule import Rule
from .telemetry import Rec, Telemetry, Worker
from .thresholds import Thresholds

_EPISODE_MIN_GAP = 0.2  # share of step time: the wait after the split exceeds the wait before by this

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

    def __init__(self, th: Thresholds) -> None:
        super().__init__(th)
        self._began: dict[str, int] = {}  # worker -> step the input wait rose at (first episode)

    def check(self, tel: Telemetry) -> None:
        for w in tel.step_workers():
            s, scope = w.input_share()  # the one figure every view quotes
            if (not w.ended and s is not None and s.level in ("moderate", "high")
                    and w.name not in self._began):
                self._began[w.name] = episode_start(w.window, s.first_step)
            self._judge(w.name, w.last_step_t or 0.0, s, scope, w)

    def _judge(self, worker: str, t: float, s: InputShare | None, scope: str,
               w: Worker | None = None) -> None:
        th = self.th
        if s is None or s.level not in ("moderate", "high"):
            return
        # the finding's steps are where the wait held: from the step it rose at, when the
        # live window saw it rise (a run input-bound from its start begins at its first step)
        first_step = max(s.first_step, self._began.get(worker, s.first_step))
        severity: Severity = "warning" if s.level == "high" else "info"
        pct = round(100 * s.share)
        advice = ADVICE
        cause: dict[str, str | int | float] = {}
        p = training_pipeline(w.pipelines) if w is not None else None
        if w is not None and p is not None:
            fn = w.window[-1][5] if w.window else ""
            c = culprit(p, fetch_in_step=fn in KERAS_STEP_FUNCTIONS)
            measured: dict[str, str | int | float] = {}
            if w.input_stages is not None:
                c, measured = with_measurement(p, c, w.input_stages)
            advice = f"{c.problem}: {c.fix}"
            # said in the advice only where the profile measured the stage the advice changes
            if ("measured_share_pct" in measured
                    and (measured["measured_stage"], measured["measured_site"]) == (c.stage, c.site)):
                advice = (f"{c.problem} (measured: {measured['measured_share_pct']}% of the input pipeline's "
                          f"time in a profile of steps {measured['profile_steps']}): {c.fix}")
            cause = {"culprit_stage": c.stage, "culprit_site": c.site, "fix": c.fix, **measured}
            if c.new_code:
                cause.update(fix_code_old=c.old_code, fix_code_new=c.new_code)
        self._keep(worker, Finding(
            t=t, rule=self.id, severity=severity,
            # no step count in the message: it would re-announce the finding every second
            message=(f"{s.verdict}: {percent(s.share)} of step time waiting for input "
                     f"(mean {finding_ms(s.wait_per_step_s)} of {finding_ms(s.step_time_s)} per step {scope})"),
            advice=advice,
            evidence={
                **cause,
                "input_wait_pct": pct,
                "input_wait_ms_per_step": sig(s.wait_per_step_s * 1000),
                "step_time_ms": sig(s.step_time_s * 1000),
                "window_steps": s.steps,
                "scope": scope,
                "info_threshold_pct": round(100 * th.input_info_frac),
                "warning_threshold_pct": round(100 * th.input_warning_frac),
                "min_wait_ms": sig(th.input_min_wait_s * 1000),
            },
            first_step=first_step, last_step=s.last_step, worker=worker,
        ))


def with_measurement(p: Pipeline, c: Culprit, m: InputStages) -> tuple[Culprit, dict[str, str | int | float]]:
    """The culprit once a profile measured the stages (``m``), and the evidence it adds.

    The stage whose iterators took the most time of their own (:func:`.pipeline_doctor.measured_stage`)
    wins over the pick by settings when they differ, when it took at least
    ``MEASURED_MIN_SHARE`` of the pipeline's time, its settings ask for an edit (one proved on
    the planted scripts: a stage parallel already gets none), and the wait is the pipeline's (not
    the eager fetch or Keras' own input, which overlap with the step already). Otherwise the
    verdict by settings stands and the evidence says what was measured."""
    ms = measured_stage(p, m)
    if ms is None:
        return c, {}
    ev: dict[str, str | int | float] = {
        "measured_stage": ms.stage, "measured_site": ms.site,
        "measured_share_pct": round(100 * ms.share), "measured_own_ms": round(ms.own_s * 1000, 1),
        "measured_iterators": ", ".join(ms.iterators)[:300],
        "profile_path": m.path, "profile_steps": f"{m.step_from}-{m.step_to}",
        "profile_capture_s": m.capture_s,
    }
    for part, value in (("before", m.step_time_before_s), ("inside", m.step_time_inside_s),
                        ("after", m.step_time_after_s)):
        if value is not None:
            ev[f"auto_profile_step_time_ms_{part}"] = round(value * 1000, 1)
    if (ms.stage, ms.site) == (c.stage, c.site):
        return c, ev
    mc = stage_culprit(p, ms.index) if not (c.overlapped or ms.share < MEASURED_MIN_SHARE) else None
    if mc is None:
        keras_own = bool(p.added_by) and all(a == "keras" for a in p.added_by)
        why = ("the pipeline is Keras' own (NumPy arrays into fit): no stage of the script's to change" if keras_own
               else "the wait is not the pipeline's stages" if c.overlapped
               else "no stage of the script's takes most of it" if ms.share < MEASURED_MIN_SHARE
               else "its settings ask for no edit (it is parallel already)")
        ev["measured_note"] = (f"the profile measured {ms.stage} at {ms.site or '?'} ({round(100 * ms.share)}% "
                               f"of the pipeline's time); the verdict above stands: {why}")
        return c, ev
    ev.update(static_stage=c.stage, static_site=c.site,
              measured_overrides=f"the settings pointed at {c.stage or 'no stage'} at {c.site or '?'}; the "
                                 f"profile measured {ms.stage} at {ms.site or '?'}: the measured stage wins")
    return mc, ev


def episode_start(window: Iterable[Rec], first_step: int) -> int:
    """The step from which the window's input wait is higher than before it: the split that
    most separates the wait share after it from the share before it (one pass over cumulative
    sums). ``first_step`` when no split separates them by much (the whole window waited)."""
    recs = [(r[0], r[2] * r[4], (r[3] or 0.0) * r[4]) for r in window if r[0] >= first_step]
    if len(recs) < 4:
        return first_step
    total_t = sum(r[1] for r in recs)
    total_w = sum(r[2] for r in recs)
    best, best_step = 0.0, first_step
    before_t = before_w = 0.0
    for i in range(1, len(recs)):
        before_t += recs[i - 1][1]
        before_w += recs[i - 1][2]
        after_t = total_t - before_t
        if before_t <= 0 or after_t <= 0:
            continue
        gap = (total_w - before_w) / after_t - before_w / before_t
        if gap > best:
            best, best_step = gap, recs[i][0]
    return best_step if best >= _EPISODE_MIN_GAP else first_step

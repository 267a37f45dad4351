"""``slow-steps``: steps that turned several times slower than the run's own median, with the
profile the agent captured while they lasted."""

from __future__ import annotations

from tpuwatch.protocol import Finding, Message, SlowSteps
from tpuwatch.units import finding_ms

from .robust_stats import sig
from .rule import Rule
from .telemetry import Telemetry, Worker


def where_it_went(m: SlowSteps) -> str:
    """What a slow step spent beside a normal one, in one line: the step call's own work, its
    input wait, or the host time between calls, whichever grew most."""
    slow_wait, normal_wait = m.slow_wait_s or 0.0, m.normal_wait_s or 0.0
    parts = {
        "the step's own work (in the step call, input wait aside)": (m.slow_step_s - slow_wait)
        - (m.normal_step_s - normal_wait),
        "waiting for input": slow_wait - normal_wait,
        "the script's Python between step calls": (m.slow_between_s or 0.0) - (m.normal_between_s or 0.0),
    }
    what, grew = max(parts.items(), key=lambda kv: kv[1])
    detail = (f"a slow step {finding_ms(m.slow_step_s)} (input wait {finding_ms(slow_wait)}, "
              f"{finding_ms(m.slow_between_s or 0.0)} between calls) vs a normal one "
              f"{finding_ms(m.normal_step_s)} (input wait {finding_ms(normal_wait)}, "
              f"{finding_ms(m.normal_between_s or 0.0)} between calls)")
    return f"{detail}: the time went to {what}, +{finding_ms(grew)} a step"


#: A slowdown this many times the median is a warning; below it (the agent's trigger is 3x) an
#: info: a busy host's contention slows a few-ms step that much, a changed workload far more.
WARNING_RATIO = 5.0


class SlowStepsRule(Rule):
    """One finding per slowdown the agent captured (at most the auto-profile's few a run)."""

    id = "slow-steps"
    observes = (SlowSteps,)

    def observe(self, msg: Message, w: Worker, tel: Telemetry) -> None:
        m: SlowSteps = msg  # type: ignore[assignment]
        ratio = m.slow_step_s / m.normal_step_s if m.normal_step_s > 0 else 0.0
        label = f"'{m.function}'" if m.function else "the step function"
        summary = where_it_went(m)
        if m.path:
            captured = f"a profile of steps {m.step_from}-{m.step_to} was captured during them: {m.path}"
            advice = (f"Open the profile ({m.path}: the dashboard's profile summary, or xprof / TensorBoard on "
                      f"its logdir) and compare the slow steps' ops with a normal step's; {summary}")
        else:
            captured = f"no profile ({m.error or 'the capture failed'})"
            advice = f"Look at what changed from step {m.first_slow_step}: {summary}"
        evidence: dict[str, float | int | str] = {
            "subject": f"from step {m.first_slow_step}",
            "function": m.function,
            "first_slow_step": m.first_slow_step,
            "slow_step_ms": sig(m.slow_step_s * 1000, 3),
            "normal_step_ms": sig(m.normal_step_s * 1000, 3),
            "ratio": sig(ratio, 2),
            "summary": summary,
        }
        if m.path:
            evidence["profile_path"] = m.path
            evidence["profile_steps"] = f"{m.step_from}-{m.step_to}"
        self._keep(f"{w.name}|{m.first_slow_step}", Finding(
            t=m.t, rule=self.id, severity="warning" if ratio >= WARNING_RATIO else "info",
            message=(f"steps of {label} turned {ratio:.2g}x slower from step {m.first_slow_step} "
                     f"({finding_ms(m.slow_step_s)} vs a median {finding_ms(m.normal_step_s)}); {captured}"),
            advice=advice, evidence=evidence,
            first_step=m.first_slow_step, last_step=m.step_to or m.first_slow_step, worker=w.name,
        ))

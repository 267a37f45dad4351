"""One cause, one finding: a finding whose cause is another finding's is folded into that one.

Applied by the engine to the rules' current findings: a rising step time that the input wait
or spread (p95 over the median) that the input wait accounts for (the wait per step is at
least half of the rise) becomes evidence of ``input-bound`` instead of a
``step-time-jitter`` finding of its own. (Host memory that grew with traces is left out by
``host-memory-growth`` itself and shown by ``retrace-storm``.)
"""

from __future__ import annotations

from dataclasses import replace

from tpuwatch.protocol import Finding

Key = tuple[str, str]  # (rule id, subject)

_EXPLAINED_SHARE = 0.5  # of the step-time rise, at least, that the input wait per step covers


def fold(current: dict[Key, Finding]) -> dict[Key, Finding]:
    """The findings left once folded (a new dict; the input is not changed)."""
    out = dict(current)
    inputs = {f.worker: (k, f) for k, f in current.items() if f.rule == "input-bound"}
    for key, f in current.items():
        if f.rule != "step-time-jitter" or f.worker not in inputs:
            continue
        ikey, inp = inputs[f.worker]
        rising = "rise_ratio" in f.evidence
        now, start = ((f.evidence.get("median_now_ms"), f.evidence.get("median_start_ms")) if rising
                      else (f.evidence.get("p95_ms"), f.evidence.get("p50_ms")))
        wait = inp.evidence.get("input_wait_ms_per_step")
        if not (isinstance(now, (int, float)) and isinstance(start, (int, float))
                and isinstance(wait, (int, float))):
            continue
        rise = float(now) - float(start)
        if rise <= 0 or float(wait) < _EXPLAINED_SHARE * rise:
            continue
        del out[key]
        inp = out[ikey]
        # the spread is a window's (the run's own p50 can differ): it says which steps
        what, text = (("step_time_rise", f"median {now} ms vs {start} ms after warm-up "
                                         f"({f.evidence['rise_ratio']}x)") if rising
                      else ("step_time_spread", f"steps {f.first_step}..{f.last_step}: p95 {now} ms "
                                                f"vs median {start} ms"))
        out[ikey] = replace(inp, evidence={**inp.evidence, what: text + ", from the input wait"})
    return out

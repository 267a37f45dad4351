"""One cause, one finding: a finding whose cause is another finding's is folded into that one.

Applied by the engine to the rules' current findings: a rising step time that the input wait
or spread (p95 over the median) that the input wait accounts for (the wait per step is at
least half of the rise) becomes evidence of ``input-bound`` instead of a
``step-time-jitter`` finding of its own; so does a spread that a captured slowdown accounts for
(``slow-steps`` of the same function, its slow steps at least half the p95 and its normal ones
at most twice the median) become evidence of that ``slow-steps`` finding. (Host memory that grew with traces is left out by
``host-memory-growth`` itself and shown by ``retrace-storm``.)
"""

from __future__ import annotations

from dataclasses import replace

from tpuwatch.protocol import Finding

Key = tuple[str, str]  # (rule id, subject)

_EXPLAINED_SHARE = 0.5  # of the step-time rise, at least, that the input wait per step covers


def fold(current: dict[Key, Finding]) -> dict[Key, Finding]:
    """The findings left once folded (a new dict; the input is not changed)."""
    out = _fold_into_slowdowns(dict(current))
    current = dict(out)
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


def _ms(f: Finding, key: str) -> float | None:
    v = f.evidence.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _fold_into_slowdowns(out: dict[Key, Finding]) -> dict[Key, Finding]:
    slowdowns = [(k, f) for k, f in out.items() if f.rule == "slow-steps"]
    if not slowdowns:
        return out
    for key, f in list(out.items()):
        if f.rule != "step-time-jitter" or "rise_ratio" in f.evidence:
            continue
        p95, p50 = _ms(f, "p95_ms"), _ms(f, "p50_ms")
        if p95 is None or p50 is None:
            continue
        explaining: list[tuple[float, Key]] = []
        for k, s in slowdowns:
            slow_ms, normal_ms = _ms(s, "slow_step_ms"), _ms(s, "normal_step_ms")
            if (s.worker == f.worker and s.evidence.get("function") == f.evidence.get("function")
                    and slow_ms is not None and normal_ms is not None
                    and slow_ms >= _EXPLAINED_SHARE * p95 and normal_ms <= 2 * p50):
                explaining.append((slow_ms, k))
        if not explaining:
            continue
        skey = max(explaining)[1]
        del out[key]
        slow = out[skey]
        out[skey] = replace(slow, evidence={**slow.evidence, "step_time_spread":
                                            f"steps {f.first_step}..{f.last_step}: p95 {f.evidence['p95_ms']} ms "
                                            f"vs median {f.evidence['p50_ms']} ms, from the slowdown"})
    return out

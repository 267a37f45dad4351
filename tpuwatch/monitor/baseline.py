"""A finished run to measure a live one against (``tpuwatch run --baseline RUN``).

:class:`Baseline` holds the finished run's whole-run figures, as ``tpuwatch report`` gives them;
:func:`deltas` says how the live run differs, for the header and the headless line. The live
figures are the snapshot's own (rolling step p50, steps/s and examples/s over the last 10 s, the
input-bound rule's input wait), so the words say "now".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpuwatch.monitor.snapshot import Baseline

if TYPE_CHECKING:
    from tpuwatch.monitor.snapshot import RunSnapshot

__all__ = ["Baseline", "deltas", "ledger_delta"]


def _rel(now: float | None, then: float | None) -> str | None:
    if now is None or then is None or then <= 0:
        return None
    return f"{(now - then) / then:+.0%}"


def deltas(s: RunSnapshot) -> list[str]:
    """``["vs ab12: p50 -12%", "steps/s +14%", "ex/s +14%", "input -8 pt"]`` (empty without a
    baseline or before the live run has steps)."""
    b = s.baseline
    if b is None or not s.step:
        return []
    parts = []
    for name, now, then in (("p50", s.step_p50_s, b.step_p50_s), ("steps/s", s.steps_per_s, b.steps_per_s),
                            ("ex/s", s.examples_per_s, b.examples_per_s)):
        rel = _rel(now, then)
        if rel is not None:
            parts.append(f"{name} {rel}")
    if s.input_wait_frac is not None and b.input_wait_share is not None:
        parts.append(f"input {100 * (s.input_wait_frac - b.input_wait_share):+.0f} pt")
    if not parts:
        return []
    return [f"vs {b.label}: {parts[0]}", *parts[1:]]


def ledger_delta(s: RunSnapshot, bucket: str | None = None) -> str:
    """``"+12 pt"``: the live ledger's goodput (``bucket`` None) or a bucket's share of the wall
    time, less the baseline's; "" without a baseline, a ledger, or the baseline's figure."""
    b, lg = s.baseline, s.ledger
    if b is None or lg is None or lg.wall_s <= 0:
        return ""
    if bucket is None:
        now, then = lg.goodput, b.goodput
    else:
        now, then = lg.share(bucket), b.ledger_shares.get(bucket)
    if now is None or then is None:
        return ""
    return f"{100 * (now - then):+.0f} pt"

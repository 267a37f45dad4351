"""Figures computed on both sides of the wire, defined once: the agent (its summaries, its
automatic profile) and the viewer (``monitor``: the step statistics, the diagnostics rules)
import them from here. Standard library only, like the rest of the foundation.

- :func:`quantile`: every step-time p50/p95 (the rolling and whole-run figures of
  ``monitor.stats``, the agent's ``host_summary``, the jitter and stall rules), every median.
- The input-bound thresholds: the ``input-bound`` rule's defaults
  (``monitor.diagnostics.thresholds.Thresholds``) and the share at which the agent's automatic
  profile begins to watch an episode (``agent.auto_profile``).
"""

from __future__ import annotations

from typing import Sequence

#: xprof's input-pipeline verdict: >= 5 % of step time waiting is "moderately", >= 20 % "highly"
#: input-bound.
INPUT_INFO_FRAC = 0.05
INPUT_WARNING_FRAC = 0.20
#: Mean wait per step below this is noise, whatever its share: timing a fetch from a ready
#: prefetch buffer costs tens of microseconds.
INPUT_MIN_WAIT_S = 0.0001


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of already sorted, non-empty values, interpolated linearly between
    the closest ranks (numpy's default): ``lo + (hi - lo) * frac``, which is exactly ``lo`` when
    the two neighbours are equal and never leaves ``[lo, hi]``."""
    n = len(sorted_values)
    if n == 1:
        return float(sorted_values[0])
    pos = q * (n - 1)
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    low = sorted_values[lo]
    return float(low + (sorted_values[hi] - low) * (pos - lo))

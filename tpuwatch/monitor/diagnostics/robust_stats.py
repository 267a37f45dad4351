"""Small robust statistics over plain lists (no numpy in the monitor: it must start fast)."""

from __future__ import annotations

import math
from typing import Sequence

from tpuwatch.figures import quantile


def median(values: Sequence[float]) -> float:
    return quantile(sorted(values), 0.5)


def mad(values: Sequence[float], center: float | None = None) -> float:
    """Median absolute deviation (unscaled)."""
    c = median(values) if center is None else center
    return median([abs(v - c) for v in values])


def theil_sen(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Median of pairwise slopes and the share of pairs (with distinct x) that increase.

    Robust to a few outliers (a sample taken during a GC pause) where least squares is not.
    O(n^2): callers keep ``points`` short (a hundred or so).
    """
    slopes: list[float] = []
    ups = 0
    for i in range(len(points)):
        xi, yi = points[i]
        for j in range(i + 1, len(points)):
            xj, yj = points[j]
            if xj == xi:
                continue
            s = (yj - yi) / (xj - xi)
            slopes.append(s)
            if s > 0:
                ups += 1
    if not slopes:
        return 0.0, 0.0
    return median(slopes), ups / len(slopes)


def sig(x: float, digits: int = 3) -> float:
    """``x`` rounded to ``digits`` significant digits, so evidence does not churn on noise."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))

"""Comparing traced functions across instances: two traces of the *same* graph can differ in speed.

Measured on this project's 2-core box (``bench/ingraph_cost.py --fit``, one graph traced twice,
40 interleaved rounds): a tiny step's two plain traces differed by 327 µs (5.5%); over 3 traces,
the plain spread was 50–1,100 µs from run to run. That is as much as the in-graph probes' whole
cost, so one plain and one instrumented trace cannot tell that cost apart. The benches therefore
trace several instances of each variant, interleave all of them, and compare medians over
instances; the plain instances' own spread is printed as the floor below which a difference
means nothing. Differences measured on the *same* instance (the agent on and off for one traced
function: the Python side) have no such floor.
"""

from __future__ import annotations

import statistics


def medians(times: dict[tuple[str, int], list[float]]) -> dict[tuple[str, int], float]:
    return {key: statistics.median(values) for key, values in times.items()}


def over_instances(med: dict[tuple[str, int], float], variant: str) -> float:
    """The median over instances of one variant's per-instance medians."""
    return statistics.median(v for (name, _), v in med.items() if name == variant)


def spread(med: dict[tuple[str, int], float], variant: str) -> float:
    """Largest minus smallest per-instance median of one variant (its instance noise)."""
    values = [v for (name, _), v in med.items() if name == variant]
    return max(values) - min(values)


def paired(med: dict[tuple[str, int], float], a: str, b: str) -> float:
    """Median over instances of ``a - b`` measured on the same instance."""
    return statistics.median(med[(a, i)] - med[(b, i)] for (name, i) in med if name == a)

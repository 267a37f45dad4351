"""Short human forms of the numbers tpuwatch shows (bytes, durations, rates, shares).

Pure functions, shared by the headless progress line, the report and the dashboard.
``None`` (not measured) is shown as an em dash.
"""

from __future__ import annotations

import math

NA = "—"


def fmt_bytes(n: float | None) -> str:
    """Binary units: ``fmt_bytes(3 * 2**30) == "3.0 GiB"``."""
    if n is None:
        return NA
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit in ("B", "KiB", "MiB") else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} TiB"  # unreachable; keeps type checkers content


def fmt_seconds(s: float | None) -> str:
    """A step-scale time: µs, ms or s with 3 significant figures."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return NA
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1.0:
        return f"{s * 1e3:.3g} ms"
    return f"{s:.3g} s"


def fmt_duration(s: float | None) -> str:
    """A run-scale time: ``"42s"``, ``"3m07s"``, ``"2h05m"``, ``"3d04h"``."""
    if s is None or not math.isfinite(s):
        return NA
    s = max(0.0, s)
    if s < 60:
        return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def fmt_rate(per_s: float | None, unit: str = "steps/s") -> str:
    if per_s is None:
        return NA
    if per_s >= 100:
        return f"{per_s:,.0f} {unit}"
    return f"{per_s:.3g} {unit}"


def fmt_pct(frac: float | None) -> str:
    """A share 0..1 as a percentage."""
    if frac is None:
        return NA
    return f"{100 * frac:.0f}%" if frac >= 0.01 or frac == 0 else f"{100 * frac:.1f}%"


def fmt_loss(v: float | None) -> str:
    if v is None:
        return NA
    if not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return f"{v:.4g}"

"""How the dashboard writes numbers: durations, sizes, rates, clock times.

Short fixed-width forms so columns line up at 80 columns; every function takes plain numbers
(``None`` for unknown, which prints as an em dash) and never raises on nan/inf.
"""

from __future__ import annotations

import math

UNKNOWN = "—"


def duration(seconds: float | None) -> str:
    """A step-sized duration: ``850 µs``, ``12.3 ms``, ``1.24 s``, ``2m05s``."""
    if seconds is None or not math.isfinite(seconds):
        return UNKNOWN
    s = abs(seconds)
    if s < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if s < 0.1:
        return f"{seconds * 1e3:.1f} ms"
    if s < 1:
        return f"{seconds * 1e3:.0f} ms"
    if s < 60:
        return f"{seconds:.2f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s"


def clock(seconds: float | None) -> str:
    """Elapsed wall time as ``H:MM:SS`` (``M:SS`` under an hour)."""
    if seconds is None or not math.isfinite(seconds):
        return UNKNOWN
    total = max(0, int(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def size(n_bytes: float | None) -> str:
    """Binary units, 3 significant digits: ``512 B``, ``1.50 KiB``, ``12.3 GiB``."""
    if n_bytes is None or not math.isfinite(n_bytes):
        return UNKNOWN
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    if unit == "B":
        return f"{int(value)} B"
    if abs(value) < 10:
        return f"{value:.2f} {unit}"
    if abs(value) < 100:
        return f"{value:.1f} {unit}"
    return f"{value:.0f} {unit}"


def count(n: float | None) -> str:
    """Compact counts and rates: ``950``, ``12.5``, ``4.10k``, ``1.2M``."""
    if n is None or not math.isfinite(n):
        return UNKNOWN
    a = abs(n)
    if a >= 1e6:
        return f"{n / 1e6:.1f}M"
    if a >= 1e4:
        return f"{n / 1e3:.1f}k"
    if a >= 1e3:
        return f"{n / 1e3:.2f}k"
    if a >= 100 or float(n).is_integer():
        return f"{n:.0f}"
    return f"{n:.1f}"


def integer(n: int | None) -> str:
    """Thousands separated: ``12,345``."""
    return UNKNOWN if n is None else f"{n:,}"


def loss(value: float | None) -> str:
    """A loss value at 4 significant digits; non-finite values spelled out."""
    if value is None:
        return UNKNOWN
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        return f"{value:.3e}"
    return f"{value:.4g}"


def signed(value: float) -> str:
    """A deviation with its sign: ``+0.0012``, ``-1.3e-05``."""
    if not math.isfinite(value):
        return loss(value)
    if value != 0 and abs(value) < 1e-3:
        return f"{value:+.1e}"
    return f"{value:+.4f}"


def percent(fraction: float | None) -> str:
    """A share (0..1) as ``7.5%``."""
    if fraction is None or not math.isfinite(fraction):
        return UNKNOWN
    return f"{fraction * 100:.1f}%" if fraction < 0.1 else f"{fraction * 100:.0f}%"

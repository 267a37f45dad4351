"""Numbers with units for one-line finding messages (2-3 significant digits, no exponents)."""

from __future__ import annotations


def ms(seconds: float) -> str:
    """``0.0834`` -> ``"83 ms"``, ``0.00432`` -> ``"4.3 ms"``, ``1.5`` -> ``"1500 ms"``."""
    v = seconds * 1000
    if v >= 10:
        return f"{v:.0f} ms"
    return f"{v:.2g} ms"


def duration(seconds: float) -> str:
    """``75`` -> ``"75 s"``, ``750`` -> ``"12.5 min"``."""
    return f"{seconds:.0f} s" if seconds < 100 else f"{seconds / 60:.1f} min"

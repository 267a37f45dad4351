"""How tpuwatch writes numbers, in every output: the dashboard, the headless lines and
``report``, and the one-line messages of findings.

A byte count, a loss and a step-scale time are written one way everywhere: :func:`size`
(``3.00 GiB``, ``1.50 KiB``), :func:`loss` (``0.6931``, ``NaN``, ``+Inf``) and :func:`duration`
(``850 µs``, ``12.3 ms``, ``1.24 s``, ``2m05s``; the lines call it by its older name
:data:`fmt_seconds`). A run's length has two forms, because each output has its own width and
readers: :func:`clock` in the dashboard (``1:02:03``), :func:`fmt_duration` in the lines
(``1h02m``).

A share has one form everywhere: one decimal below 10%, so one near a threshold (4.5%) never
reads as the threshold (5%). Findings' messages (:mod:`tpuwatch.monitor.diagnostics`) use :func:`finding_ms` and
:func:`finding_duration`: 2-3 significant digits and no exponents, so that a message reads as a
sentence. Every function takes plain numbers; ``None`` (not measured) prints as :data:`UNKNOWN`.
Standard library only: every part of the viewer side imports this.
"""

from __future__ import annotations

import math

#: What an unknown (not measured) number prints as.
UNKNOWN = "—"


# --- the dashboard: short fixed-width forms so columns line up at 80 columns; never raise on
# nan/inf --------------------------------------------------------------------------------------

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

def device_name(device: str) -> str:
    """A TensorFlow device's own name: ``/job:worker/replica:0/task:1/device:TPU:3`` -> ``TPU:3``
    (what the agent puts on the wire: a topology's devices, memory samples' devices)."""
    return device.rsplit("device:", 1)[-1] if "device:" in device else device


def short_device(device: str) -> str:
    """A device as the dashboard labels it: ``/job:worker/replica:0/task:1/device:TPU:3`` ->
    ``t1/TPU:3`` (``TPU:3`` on task 0)."""
    task = ""
    for part in device.split("/"):
        if part.startswith("task:") and part != "task:0":
            task = "t" + part[5:] + "/"
    return task + device_name(device)


# --- lines: the headless progress line, its summary and ``report`` ---------------------------


def function_label(name: str, evaluation: bool) -> str:
    """How a traced function is named everywhere: an evaluation function (``Retrace.evaluation``)
    apart from the training function of the same name (Keras names both
    ``multi_step_on_iterator``)."""
    return f"{name} (evaluation)" if evaluation else name


#: A step-scale time in the lines is written as the dashboard writes it: one format,
#: :func:`duration` (the lines' own, 3 significant figures, wrote 4.31 ms where the Workers panel
#: wrote 4.3 ms, 125 s where it wrote 2m05s, and infinity as "inf s").
fmt_seconds = duration


def fmt_duration(s: float | None) -> str:
    """A run-scale time: ``"42s"``, ``"3m07s"``, ``"2h05m"``, ``"3d04h"``."""
    if s is None or not math.isfinite(s):
        return UNKNOWN
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
        return UNKNOWN
    if per_s >= 100:
        return f"{per_s:,.0f} {unit}"
    return f"{per_s:.3g} {unit}"



# --- findings' messages ----------------------------------------------------------------------


def finding_ms(seconds: float) -> str:
    """``0.0834`` -> ``"83 ms"``, ``0.00432`` -> ``"4.3 ms"``, ``1.5`` -> ``"1500 ms"``."""
    v = seconds * 1000
    if v >= 10:
        return f"{v:.0f} ms"
    return f"{v:.2g} ms"


def finding_duration(seconds: float) -> str:
    """``75`` -> ``"75 s"``, ``750`` -> ``"12.5 min"``."""
    return f"{seconds:.0f} s" if seconds < 100 else f"{seconds / 60:.1f} min"


def replicas(n: int) -> str:
    """``1`` -> ``"1 replica"``, ``4`` -> ``"4 replicas"``: one wording in every view."""
    return f"{n} replica" if n == 1 else f"{n} replicas"


def keras_value(value: float | None) -> str:
    """A value Keras logged, as Keras' progress bar prints it (``2.2999``, ``1.2346e-04``): the
    user finds the same digits in the script's own output."""
    if value is None or not math.isfinite(value):
        return loss(value)
    return f"{value:.4f}" if abs(value) > 1e-3 else f"{value:.4e}"

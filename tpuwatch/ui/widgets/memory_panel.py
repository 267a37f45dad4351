"""Memory: each device's current/peak against its limit when known; host RSS and headroom, the
process's CPU% and the host's load, with RSS and CPU% charts where no device figures fill the box
(a CPU host) or when expanded; why a device's memory is missing, when it is."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import Static

from tpuwatch import units
from tpuwatch.monitor.snapshot import DeviceMemory, RunSnapshot
from tpuwatch.ui.widgets.history_bars import BarSeries, HistoryBars
from tpuwatch.ui.widgets.panel import Panel

WARN_FRAC = 0.85
CRITICAL_FRAC = 0.95
#: Host memory left (available / total) below which the panel warns.
HOST_WARN_FREE = 0.10
HOST_CRITICAL_FREE = 0.05


def _use(d: DeviceMemory) -> float | None:
    return d.peak_bytes / d.limit_bytes if d.limit_bytes else None


def _style(frac: float | None) -> str:
    if frac is None:
        return ""
    return "$error bold" if frac >= CRITICAL_FRAC else "$warning bold" if frac >= WARN_FRAC else ""


def _libtpu_line(d: DeviceMemory, width: int) -> Content:
    """A device read from libtpu: HBM used/total now, then headroom and duty cycle if they fit
    (``TPU:3 30.0/32.0 GiB 94%  2.00 GiB free  duty 99%``). Coloured by the peak's share."""
    limit = d.limit_bytes or 0  # the caller shows this line only for a device with a limit
    used, total = units.size(d.current_bytes), units.size(limit)
    unit = total.rpartition(" ")[2]
    if used.endswith(" " + unit):
        used = used[: -len(unit) - 1]
    style = _style(_use(d))
    line = Content.assemble(f"{units.short_device(d.device)[:10]:<6}", (used, style), ("/", "dim"), total,
                            (f" {units.percent(d.current_bytes / limit)}", style or "dim"))
    extras = [Content.assemble(("  duty ", "dim"), f"{d.duty_cycle_pct:.0f}%")] if d.duty_cycle_pct is not None else []
    extras.insert(0, Content.assemble(("  ", ""), units.size(max(0, limit - d.current_bytes)), (" free", "dim")))
    for extra in extras:
        if line.cell_length + extra.cell_length <= width:
            line += extra
    return line


def tracked(s: RunSnapshot) -> tuple[DeviceMemory, ...]:
    """The devices with figures: TF's CPU allocator keeps no statistics by default and reports 0 B
    current and peak (a real Keras fit on a CPU host, TF 2.21), which is no figure at all."""
    return tuple(d for d in s.device_memory if d.peak_bytes or d.current_bytes or d.limit_bytes)


def missing_note(s: RunSnapshot) -> str:
    """Why no device memory is shown: the agent's typed reason, else the untracked allocator."""
    if tracked(s):
        return ""
    if s.device_memory_notes:
        return s.device_memory_notes[0]
    if s.device_memory:
        names = ", ".join(d.device for d in s.device_memory)
        return f"{names}: TensorFlow keeps no statistics for this allocator (it reports 0 B)"
    return ""


def memory_text(s: RunSnapshot, rows: int, width: int = 80) -> Content:
    lines: list[Content] = []
    for h in s.host_memory:
        free = h.available_bytes / h.total_bytes if h.total_bytes else None
        style = ("" if free is None else "$error bold" if free < HOST_CRITICAL_FREE
                 else "$warning bold" if free < HOST_WARN_FREE else "")
        who = "host" if len(s.host_memory) == 1 else h.worker[:10]
        line = Content.assemble(
            (f"{who:<10}", "bold"), units.size(h.rss_bytes), (" RSS ", "dim"),
            (units.size(h.available_bytes), style), (" free", "dim"),
        )
        total = Content.assemble((" of ", "dim"), units.size(h.total_bytes))
        lines.append(line + total if line.cell_length + total.cell_length <= width else line)
        load = f" · load {h.load_1m:.2f}" if h.load_1m is not None else ""
        # The training process's CPU (100% = one core busy; 0% while training is the clue of a pause).
        lines.append(Content.assemble((f"{'':<10}", ""), f"{h.cpu_percent:.0f}%", (" CPU", "dim"), (load, "dim")))
    if note := missing_note(s):
        lines.append(Content.styled(f"no device memory: {note}", "dim italic"))
    devices = sorted(tracked(s), key=lambda d: -(_use(d) or 0.0))
    room = max(0, rows - len(lines) - (1 if s.tpu_metrics_note else 0))
    hidden = 0
    if len(devices) > room:
        hidden = len(devices) - max(0, room - 1)
        devices = devices[: max(0, room - 1)]
    for d in sorted(devices, key=lambda d: d.device):
        if d.source == "tpu-info" and d.limit_bytes:
            lines.append(_libtpu_line(d, width))
            continue
        frac = _use(d)
        parts: list[Content | tuple[str, str] | str] = [
            f"{units.short_device(d.device)[:10]:<10}", units.size(d.current_bytes),
            ("  peak ", "dim"), (units.size(d.peak_bytes), _style(frac)),
        ]
        if d.limit_bytes:
            parts += [("/", "dim"), units.size(d.limit_bytes), (f" {units.percent(frac)}", _style(frac) or "dim")]
        lines.append(Content.assemble(*parts))
    # TensorFlow's logical CPU devices are views of one host allocator: one figure, said so.
    cpus = len(tracked(s)) > 1 and all(units.device_name(d.device).startswith("CPU") for d in tracked(s))
    if hidden:
        lines.append(Content.styled(f"… {hidden} more CPUs: one shared allocator" if cpus
                                    else f"… {hidden} more devices", "dim"))
    elif cpus and len(lines) < rows:
        lines.append(Content.styled("CPUs: one shared allocator", "dim"))
    if s.tpu_metrics_note:
        lines.append(Content.styled(s.tpu_metrics_note, "dim italic"))
    if not lines:
        return Content.styled("no memory samples yet", "dim")
    return Content("\n").join(lines)


def rss_series(s: RunSnapshot) -> BarSeries:
    values = tuple(float(p.rss_bytes) for p in s.host_history)
    top = max(values, default=0.0)
    return BarSeries(values, 0.0, top or 1.0, name="rss", top_label=f"{top / 2**30:.1f}G", reduce="max")


def cpu_series(s: RunSnapshot) -> BarSeries:
    values = tuple(p.cpu_percent for p in s.host_history)
    top = max(100.0, max(values, default=0.0))
    return BarSeries(values, 0.0, top, name="cpu%", top_label=f"{top:.0f}%", reduce="mean")


class MemoryPanel(Panel):
    TITLE = "3 Memory"  # the number key that jumps here

    def compose(self) -> ComposeResult:
        yield Static(classes="body", markup=False)
        yield HistoryBars(id="rss-bars")
        yield HistoryBars(id="cpu-bars")

    def update_extra(self, snapshot: RunSnapshot) -> None:
        # Charts where the devices leave the box empty (a CPU host), or expanded.
        charts = bool(snapshot.host_history) and (not tracked(snapshot) or self.has_class("-maximised"))
        self.set_class(charts, "-charts")
        if charts:
            self.query_one("#rss-bars", HistoryBars).series = rss_series(snapshot)
            self.query_one("#cpu-bars", HistoryBars).series = cpu_series(snapshot)

    def body(self, snapshot: RunSnapshot, rows: int, width: int) -> Content:
        return memory_text(snapshot, rows, width)

    def state(self, snapshot: RunSnapshot) -> str | None:
        fracs = [f for f in map(_use, snapshot.device_memory) if f is not None]
        free = [h.available_bytes / h.total_bytes for h in snapshot.host_memory if h.total_bytes]
        if any(f >= CRITICAL_FRAC for f in fracs) or any(f < HOST_CRITICAL_FREE for f in free):
            return "-critical"
        if any(f >= WARN_FRAC for f in fracs) or any(f < HOST_WARN_FREE for f in free):
            return "-warning"
        return None

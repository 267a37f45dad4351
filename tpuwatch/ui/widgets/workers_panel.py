"""Workers: one row per host of a multi-worker run (shown only when there are two or more).

Each row: the worker, its state (a dead one says how it ended: ``crashed (exit 137)``, ``lost``,
``disconnected``), its step, median step time, input-wait share, host RSS and device memory,
a ``straggler`` mark when the ``straggler-host`` rule names it, and the rules of the findings about
that worker alone (``input-bound``). In synchronous training every
worker's step time equalises to the slowest one's, so the input-wait column is the telling one.

A viewer of many hosts takes summaries from them (docs/multihost.md): the border says how many,
``[`` and ``]`` select a worker (its name is highlighted while the panel has focus) and ``v`` asks
for that worker's every record (the app's ``zoom_worker``).
"""

from __future__ import annotations

from textual.binding import Binding
from textual.content import Content

from tpuwatch import units
from tpuwatch.monitor.snapshot import RunSnapshot, worker_exit_codes, worker_status_text
from tpuwatch.ui.widgets.memory_panel import MemoryPanel
from tpuwatch.ui.widgets.panel import Panel

_STATE_STYLE = {"crashed": "$error bold", "lost": "$warning bold", "disconnected": "$warning bold",
                "stalled": "$warning bold", "finished": "$success", "running": ""}


def stragglers(s: RunSnapshot) -> dict[str, str]:
    """Worker -> what the ``straggler-host`` finding says is slow about it (``input wait +85 ms``)."""
    out: dict[str, str] = {}
    for f in s.findings:
        if f.rule != "straggler-host":
            continue
        name = str(f.evidence.get("straggler_worker") or f.worker)
        metric = str(f.evidence.get("metric", ""))
        excess = f.evidence.get("excess_ms")
        label = metric.replace("_", " ")
        out[name] = f"{label} +{excess:g} ms" if isinstance(excess, (int, float)) else label
    return out


def worker_findings(s: RunSnapshot) -> dict[str, list[str]]:
    """Worker -> the rules (warning or worse, straggler-host apart) whose finding is about that
    worker alone, so the row of the worker a finding speaks of says so."""
    out: dict[str, list[str]] = {}
    if len(s.workers) < 2:
        return out
    for f in s.findings:
        if f.worker and f.rule != "straggler-host" and f.severity in ("warning", "critical"):
            rules = out.setdefault(f.worker, [])
            if f.rule not in rules:
                rules.append(f.rule)
    return out


#: Below this many columns (the narrow layout's half-width cell) rows use the compact form.
COMPACT_BELOW = 60


def _short_state(state: str) -> str:
    """``crashed (exit 137)`` -> ``exit 137``; ``disconnected`` -> ``disconn.``"""
    if "(exit " in state:
        return state[state.index("(") + 1:-1]
    return {"disconnected": "disconn."}.get(state, state)


def _compact_row(w, state: str, style: str, straggler: bool, width: int) -> Content:
    """``worker:1 exit 137  #30 101 ms in 49%`` plus ``SLOW`` for a straggler, as much as fits."""
    line = Content.assemble((f"{w.name[:9]:<9}", "bold"), (f"{_short_state(state)[:9]:<9}", style))
    extras = [Content.assemble((" #", "dim"), units.integer(w.step)),
              Content.assemble(" ", units.duration(w.step_p50_s)),
              Content.assemble((" in ", "dim"), units.percent(w.input_wait_frac))]
    if straggler:
        extras.insert(0, Content.styled(" SLOW", "$warning bold"))
    for extra in extras:
        if line.cell_length + extra.cell_length > width:
            break
        line += extra
    return line


def workers_text(s: RunSnapshot, rows: int, width: int = 80, selected: int | None = None) -> Content:
    """The rows; ``selected``: the index of the worker to highlight (and keep in view)."""
    if not s.workers:
        return Content.styled("no worker has reported yet", "dim")
    codes = worker_exit_codes(s)
    slow = stragglers(s)
    named = worker_findings(s)
    dev: dict[str, int] = {}
    for d in s.device_memory:
        dev[d.worker] = dev.get(d.worker, 0) + d.current_bytes
    lines: list[Content] = []
    first = 0
    if len(s.workers) > rows and selected is not None and selected >= rows - 1:
        first = min(selected - (rows - 2), len(s.workers) - (rows - 1))  # keep the selection in view
    shown = s.workers if len(s.workers) <= rows else s.workers[first: first + max(0, rows - 1)]
    for n, w in enumerate(shown, first):
        state = worker_status_text(s, w.name, w.status, w.connected, codes)
        style = _STATE_STYLE.get(state.split(" ")[0], "")
        if width < COMPACT_BELOW:
            lines.append(_compact_row(w, state, style, w.name in slow, width))
            continue
        line = Content.assemble(
            (f"{w.name[:12]:<12} ", "bold reverse" if n == selected else "bold"),
            (f"{state[:18]:<18} ", style),
            ("step ", "dim"), f"{units.integer(w.step):>7} ",
            ("p50 ", "dim"), f"{units.duration(w.step_p50_s):>8} ",
            ("in ", "dim"), f"{units.percent(w.input_wait_frac):>4} ",
        )
        extras = [Content.assemble(("RSS ", "dim"), units.size(w.rss_bytes), " ")]
        if w.name in dev:
            extras.append(Content.assemble(("dev ", "dim"), units.size(dev[w.name]), " "))
        if w.host:
            extras.append(Content.styled(w.host[:16] + " ", "dim"))
        if w.name in slow:
            tag = Content.styled(f"straggler: {slow[w.name]}", "$warning bold")
            extras.insert(0, tag + " ")
        if w.name in named:
            extras.insert(0, Content.styled(", ".join(named[w.name]), "$warning bold") + " ")
        for extra in extras:
            if line.cell_length + extra.cell_length <= width:
                line += extra
        lines.append(line)
    if len(shown) < len(s.workers):
        lines.append(Content.styled(f"… {len(s.workers) - len(shown)} more workers", "dim"))
        if first:
            lines[-1] = Content.styled(f"… {first} workers above, {len(s.workers) - len(shown) - first} below", "dim")
    return Content("\n").join(lines)


class WorkersPanel(Panel):
    TITLE = "0 Workers"  # the number key that jumps here (with two or more workers)
    BINDINGS = [
        Binding("left_square_bracket", "select(-1)", "Previous worker", show=False),
        Binding("right_square_bracket", "select(1)", "Next worker", show=False),
        Binding("v", "app.zoom_worker", "Every record", show=False,
                tooltip="Workers panel: the selected worker ([ ]) sends every record instead of summaries"),
    ]
    selected = 0  # index into the snapshot's workers

    def body(self, snapshot: RunSnapshot, rows: int, width: int) -> Content:
        return workers_text(snapshot, rows, width, self.selected if self.has_focus else None)

    def selected_worker(self) -> str | None:
        workers = self.snapshot.workers
        return workers[min(self.selected, len(workers) - 1)].name if workers else None

    def action_select(self, step: int) -> None:
        if self.snapshot.workers:
            self.selected = (self.selected + step) % len(self.snapshot.workers)
            self.watch_snapshot(self.snapshot)

    def on_focus(self) -> None:
        self.watch_snapshot(self.snapshot)

    def on_blur(self) -> None:
        self.watch_snapshot(self.snapshot)

    def update_extra(self, snapshot: RunSnapshot) -> None:
        # each row's input share is the input-bound rule's for that worker: say over what
        scopes = {w.input_scope for w in snapshot.workers if w.input_scope}
        parts = [f"input {scopes.pop()}"] if len(scopes) == 1 else []
        summarised = sum(w.summary for w in snapshot.workers)
        if summarised:
            parts.append(f"{summarised:,} on summaries; [ ] v: every record")
        self.border_subtitle = " · ".join(parts)

    def on_mount(self) -> None:
        self.styles.column_span = 3  # a whole row of the wide grid; one cell of the narrow one
        super().on_mount()

    def watch_snapshot(self, snapshot: RunSnapshot) -> None:
        many = len(snapshot.workers) > 1
        self.set_class(not many, "-one-worker")
        if self.is_mounted:
            # In the narrow layout (80x24) this panel takes the memory panel's cell: its rows
            # carry each host's RSS and device memory, and the screen has no room for both.
            narrow = self.screen.has_class("-narrow")
            self.styles.column_span = 1 if narrow else 3
            for memory in self.screen.query(MemoryPanel):
                # A class, not an inline display: inline styles would beat the stylesheet's
                # layouts (an expanded panel hides the others with CSS).
                memory.set_class(many and narrow, "-workers-cell")
        super().watch_snapshot(snapshot)

    def state(self, snapshot: RunSnapshot) -> str | None:
        statuses = {w.status for w in snapshot.workers}
        if "crashed" in statuses:
            return "-critical"
        if statuses & {"lost", "stalled"} or not all(w.connected or w.status in ("finished", "stopped", "crashed")
                                                     for w in snapshot.workers):
            return "-warning"
        if stragglers(snapshot):
            return "-warning"
        return None

"""Per-replica loss: one row per replica with its deviation from the replica mean."""

from __future__ import annotations

import math
from typing import Literal

from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import Static

from tpuwatch import units
from tpuwatch.monitor.snapshot import LAST_STEP, ReplicaLoss, RunSnapshot, keras_loss, mean_loss
from tpuwatch.ui.widgets.history_bars import BarSeries, HistoryBars
from tpuwatch.ui.widgets.panel import EXPANDED_ROWS, Panel

#: The findings that judge the losses. The panel's colour comes from them only: a replica 10%
#: off on one step is noise near zero loss; the skew rule decides what is persistent.
LOSS_RULES = ("loss-nonfinite", "replica-loss-skew")
_SEVERITY_CLASS = {"critical": "-critical", "warning": "-warning"}


def flagged_replicas(s: RunSnapshot) -> set[int]:
    """Replicas a loss finding names (its ``replica`` evidence)."""
    out: set[int] = set()
    for f in s.findings:
        if f.rule in LOSS_RULES:
            r = f.evidence.get("replica")
            if isinstance(r, int):
                out.add(r)
    return out


def loss_state(s: RunSnapshot) -> str | None:
    """The panel's state class: the most severe loss finding's."""
    severities = {f.severity for f in s.findings if f.rule in LOSS_RULES}
    for sev in ("critical", "warning"):
        if sev in severities:
            return _SEVERITY_CLASS[sev]
    return None


#: Seconds behind the run (at its step rate) past which the losses shown are marked stale. The
#: agent reads them at least once a second of training once a run is under way (every 0.25-1 s,
#: as a read's cost allows, and the step that reaches it): up to a second and a step behind is
#: normal, and the rate counts the host's time between steps too.
LOSS_STALE_S = 2.0


def loss_stale(s: RunSnapshot) -> bool:
    """The losses shown belong to a step more than LOSS_STALE_S behind the run's."""
    if s.loss_step is None or s.loss_step >= s.step:
        return False
    rate = s.steps_per_s or 0.0
    return rate <= 0 or (s.step - s.loss_step) / rate > LOSS_STALE_S


def short_worker(name: str) -> str:
    """``worker:1`` -> ``w1``; ``host-a:4242`` -> ``host``: a few columns that tell workers apart."""
    kind, _, index = name.rpartition(":")
    if kind == "worker" and index.isdigit():
        return f"w{index}"
    return (kind or name)[:4]


def pick_rows(replicas: tuple[ReplicaLoss, ...], room: int) -> tuple[list[ReplicaLoss], int]:
    """The replicas to list when not all fit: non-finite first, then the largest deviations;
    shown in replica order. Returns (rows, how many were left out)."""
    if len(replicas) <= room:
        return list(replicas), 0
    keep = max(0, room - 1)  # one row says how many are hidden
    ranked = sorted(replicas, key=lambda r: (r.finite, -abs(r.deviation) if r.finite else 0))
    chosen = sorted(ranked[:keep], key=lambda r: r.index)
    return chosen, len(replicas) - keep


#: Rows the chart keeps under the per-epoch table in the expanded panel (the table gives up its
#: earlier epochs first: at 80x24 a 15-epoch run's table pushed the chart out of sight).
CHART_ROWS = 8


def replica_loss_text(s: RunSnapshot, rows: int, height: int | None = None) -> Content:
    """``height``: the expanded panel's inner height, which the per-epoch table shares with the
    chart below it (None: no limit)."""
    if not s.replica_losses:
        if s.loss is not None:
            return Content.assemble(("loss ", "dim"), units.loss(s.loss),
                                    (f"  {LAST_STEP} (no per-replica values)", "dim"))
        return Content.styled("no losses yet", "dim")
    mean = mean_loss([r.loss for r in s.replica_losses])  # the one mean (a NaN replica shows)
    loss_step = s.replica_losses[0].step
    lines = [
        Content.assemble(
            ("mean ", "dim"), (units.loss(mean), "bold"),
            (f"  {LAST_STEP} {units.integer(loss_step)}", "dim"),
            ("  stale: no loss since" if loss_stale(s) else "", "$warning"),
        )
    ]
    keras = keras_loss(s)
    if keras is not None and rows > 2:
        # Keras' own figure beside tpuwatch's, saying what it is (and when it is not the mean)
        lines.append(Content.styled(keras.describe(), "$warning" if keras.note else "dim"))
    flagged = flagged_replicas(s)
    epoch = epoch_line(s)
    if epoch is not None and rows > 2:
        lines.append(epoch)
    shown, hidden = pick_rows(s.replica_losses, max(1, rows - len(lines)))
    several_workers = len({r.worker for r in s.replica_losses}) > 1
    for r in shown:
        # r<index> <device> <loss> <deviation>: 33 columns, fits a panel at 80x24. With several
        # workers the device says whose it is (each worker numbers its own devices from 0).
        device = units.short_device(r.device)
        if several_workers:
            device = f"{short_worker(r.worker)}/{device}"
        label = f"r{r.index:<3}{device[:9]:<9}"
        if not r.finite:
            lines.append(Content.assemble(label, (f"{units.loss(r.loss):>9}  NON-FINITE", "$error bold")))
            continue
        dev_style = "$warning bold" if r.index in flagged else "dim"
        mark = " ◀" if r.index in flagged else ""  # named by a finding (Findings says why)
        lines.append(Content.assemble(label, f"{units.loss(r.loss):>9}", "  ", (units.signed(r.deviation), dev_style),
                                      (mark, "$warning")))
    if hidden:
        lines.append(Content.styled(f"… {hidden} more replicas within range", "dim"))
    if rows >= EXPANDED_ROWS and s.epoch_logs:
        table = epoch_table(s)
        room = None if height is None else height - len(lines) - 1 - CHART_ROWS
        if room is not None and len(table) > room:
            earlier = len(table) - max(0, room - 2)  # the heading and a line saying what is left out
            table = [table[0], Content.styled(f"… {earlier} earlier epochs (tpuwatch report lists them)", "dim"),
                     *table[1 + earlier:]] if room >= 3 else []
        lines += [Content(""), *table] if table else []
    return Content("\n").join(lines)


def epoch_table(s: RunSnapshot) -> list[Content]:
    """Every epoch's Keras logs, one row each (the expanded panel shows it)."""
    keys: list[str] = []
    for _, logs in s.epoch_logs:
        keys += [k for k in logs if k not in keys]
    keys.sort(key=lambda k: (k != "loss", not k.startswith("val_"), k))
    names = [_short_metric(k) for k in keys]
    widths = [max(9, len(n)) for n in names]
    head = Content.styled("epoch " + " ".join(f"{n:>{w}}" for n, w in zip(names, widths)), "dim")
    rows = [head]
    for epoch, logs in s.epoch_logs:
        cells = []
        for k, w in zip(keys, widths):
            v = logs.get(k)
            cells.append(f"{(units.loss(v) if isinstance(v, float) else str(v) if v is not None else ''):>{w}}")
        rows.append(Content(f"{epoch + 1:>5} " + " ".join(cells)))
    return rows


#: Scales of the loss chart, in the order ``l`` cycles through them. "recent": the last points
#: only, scaled to their own min..max (readable after convergence, when the whole run's scale
#: makes every recent bar "▁"); "log": the whole run on a log scale; "run": the whole run, linear.
LossScale = Literal["recent", "log", "run"]
SCALES: tuple[LossScale, ...] = ("recent", "log", "run")
#: History points in the recent window.
RECENT_POINTS = 200


def loss_series(s: RunSnapshot, scale: LossScale = "recent") -> BarSeries:
    points = s.history[-RECENT_POINTS:] if scale == "recent" else s.history
    values = tuple(p.loss for p in points)
    finite = [v for v in values if v is not None and math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    shown: tuple[float | None, ...] = values
    if scale == "log" and finite and lo > 0:
        shown = tuple(math.log10(v) if v is not None and math.isfinite(v) else v for v in values)
        lo_s, hi_s = math.log10(lo), math.log10(hi)
    else:
        lo_s, hi_s = lo, hi
    axis = (f"step {units.integer(points[0].step)}", units.integer(points[-1].step)) if points else ("", "")
    return BarSeries(shown, lo_s, hi_s, name="loss", top_label=units.loss(hi), bottom_label=units.loss(lo),
                     reduce="mean", axis=axis)


def scale_title(scale: LossScale, s: RunSnapshot) -> str:
    """The chart's border subtitle: which scale, and the key that changes it."""
    if scale == "recent":
        n = min(len(s.history), RECENT_POINTS) * max(1, s.history_records_per_point)
        return f"recent {units.integer(n)} records · l: scale"
    return ("log scale" if scale == "log" else "whole run") + " · l: scale"


def _short_metric(name: str) -> str:
    if name.startswith("val_"):
        return "val_" + _short_metric(name[4:])
    for prefix, short in (("sparse_categorical_", ""), ("categorical_", ""), ("learning_rate", "lr")):
        if name.startswith(prefix):
            name = short + name[len(prefix):]
    return name.replace("accuracy", "acc")


def epoch_line(s: RunSnapshot) -> Content | None:
    """``epoch 3: val_loss 0.52 · acc 0.91 · lr 0.001`` from Keras' logs at the last epoch end."""
    if not s.epoch_logs:
        return None
    epoch, logs = s.epoch_logs[-1]
    keys = sorted(logs, key=lambda k: (not k.startswith("val_"), k == "loss", k))  # val_* first
    parts = [f"{_short_metric(k)} {units.loss(v) if isinstance(v, float) else v}" for k, v in
             ((k, logs[k]) for k in keys) if k != "loss"]
    if not parts:
        return None
    return Content.assemble((f"epoch {epoch + 1}: ", "dim"), " · ".join(parts))


class ReplicaLossPanel(Panel):
    TITLE = "2 Loss per replica"  # the number key that jumps here

    def compose(self) -> ComposeResult:
        yield Static(classes="body", markup=False)
        yield HistoryBars(id="loss-bars")

    def body(self, snapshot: RunSnapshot, rows: int, width: int) -> Content:
        return replica_loss_text(snapshot, rows, self.size.height - 2 if rows >= EXPANDED_ROWS else None)

    def state(self, snapshot: RunSnapshot) -> str | None:
        return loss_state(snapshot)

    scale: LossScale = "recent"

    def next_scale(self) -> LossScale:
        self.scale = SCALES[(SCALES.index(self.scale) + 1) % len(SCALES)]
        self.update_extra(self.snapshot)
        return self.scale

    def update_extra(self, snapshot: RunSnapshot) -> None:
        bars = self.query_one("#loss-bars", HistoryBars)
        bars.series = loss_series(snapshot, self.scale)
        # The chart is hidden at 80x24 (it shows when the panel is expanded): no key to offer then.
        self.border_subtitle = scale_title(self.scale, snapshot) if snapshot.history and bars.display else ""

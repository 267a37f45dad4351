"""``tpuwatch compare RUN_A RUN_B [...]``: runs side by side, each against the first.

Every figure is the one ``tpuwatch report`` gives for that run (this module reads each run with
:func:`~tpuwatch.console.report.build_model`: each run's typed report), so a run's numbers are the same here as
everywhere else. What compare adds:

- the difference of the step-time medians with a 95 % confidence interval: a moving-block
  bootstrap over the steps (blocks of ~sqrt(n) consecutive steps, so a slow stretch of a run
  moves together instead of being treated as independent steps; fixed seed, so a comparison
  prints the same every time); when the interval includes zero it says "no significant
  difference". The interval covers the variation within each run only: two runs of the same
  script started together on a shared 2-core machine differed by 25 % (one process got less
  CPU), and compare rightly calls that significant; the output says so beside the interval;
- the losses of every run aligned by step in one terminal chart;
- findings present in one run and not in the other, and the differences in TF/Keras versions,
  strategy, replicas, batch size, argv and config;
- one line for each thing that cannot be compared (a run without steps, different scripts or
  replica counts, a crashed run), never a traceback.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuwatch.console.report import build_model
from tpuwatch.console.report_model import FindingRow, Report, RunInfo, Summary, json_safe
from tpuwatch.monitor.diagnostics.robust_stats import median
from tpuwatch.monitor.ledger import BUCKETS, LABELS
from tpuwatch.protocol import Step
from tpuwatch.units import UNKNOWN, fmt_duration, fmt_rate, fmt_seconds, percent, size

#: Bootstrap resamples and the most steps resampled per run (evenly spaced beyond it).
RESAMPLES = 1000
MAX_SAMPLE = 2000
SEED = 0
#: Columns and rows of the loss chart.
CHART_WIDTH = 60
CHART_HEIGHT = 10
MARKS = "abcdefghij"


@dataclass
class _Steps:
    """The step records compare needs beyond a run's report (:attr:`RunData.times`,
    :attr:`RunData.losses`), noted as the report is built."""

    times: list[float] = field(default_factory=list)
    losses: dict[int, float] = field(default_factory=dict)  # step -> loss (finite only)

    def on_step(self, m: Step) -> None:
        self.times.append(m.step_time_s)
        if m.loss is not None and math.isfinite(m.loss) and m.step not in self.losses:
            self.losses[m.step] = m.loss


@dataclass
class RunData:
    """One run's report and the step records compare needs beyond it."""

    label: str  # "A", "B", ...
    report: Report
    # per-step time of each record, in order: the records the report's p50 is the median of, so
    # the difference below is the difference of the medians shown
    times: list[float] = field(default_factory=list)
    losses: dict[int, float] = field(default_factory=dict)  # step -> loss (finite only)

    @property
    def run(self) -> RunInfo:
        return self.report.run

    @property
    def summary(self) -> Summary:
        return self.report.summary


def load(label: str, run_dir: Path) -> RunData:
    """Reads one run (raises :class:`~tpuwatch.console.report.ReportError` when it holds none)."""
    steps = _Steps()
    report = build_model(run_dir, on_step=steps.on_step)
    return RunData(label, report, steps.times, steps.losses)


# --- statistics ------------------------------------------------------------------------------


def _thin(values: list[float], n: int) -> list[float]:
    if len(values) <= n:
        return values
    return [values[i * len(values) // n] for i in range(n)]


def _block_resample(values: list[float], block: int, rng: random.Random) -> list[float]:
    n = len(values)
    out: list[float] = []
    while len(out) < n:
        start = rng.randrange(0, n - block + 1)
        out.extend(values[start:start + block])
    return out[:n]


@dataclass(frozen=True)
class MedianDifference:
    """``other`` minus ``base`` step-time median, seconds, with its 95 % interval."""

    base_s: float
    other_s: float
    diff_s: float
    low_s: float
    high_s: float
    resamples: int

    @property
    def significant(self) -> bool:
        return not (self.low_s <= 0.0 <= self.high_s)

    @property
    def relative(self) -> float:
        return self.diff_s / self.base_s if self.base_s > 0 else math.nan

    def describe(self, base: str, other: str) -> str:
        interval = f"95% CI {_signed_s(self.low_s)} .. {_signed_s(self.high_s)}"
        head = f"step time median {other} - {base}: {_signed_s(self.diff_s)} ({self.relative:+.0%}; {interval})"
        if not self.significant:
            return f"{head}: no significant difference"
        faster, slower = (other, base) if self.diff_s < 0 else (base, other)
        ratio = max(self.base_s, self.other_s) / min(self.base_s, self.other_s)
        return f"{head}: {faster} is faster, its median step {ratio:.2f}x shorter than {slower}'s"


def median_difference(base: list[float], other: list[float], resamples: int = RESAMPLES,
                      seed: int = SEED) -> MedianDifference | None:
    """The difference of the two medians with a moving-block bootstrap 95 % interval (None when
    either side has fewer than 2 steps)."""
    if len(base) < 2 or len(other) < 2:
        return None
    a, b = _thin(base, MAX_SAMPLE), _thin(other, MAX_SAMPLE)
    block_a, block_b = max(1, int(math.sqrt(len(a)))), max(1, int(math.sqrt(len(b))))
    rng = random.Random(seed)
    diffs = sorted(median(_block_resample(b, block_b, rng)) - median(_block_resample(a, block_a, rng))
                   for _ in range(resamples))
    lo = diffs[int(0.025 * (resamples - 1))]
    hi = diffs[int(math.ceil(0.975 * (resamples - 1)))]
    ma, mb = median(base), median(other)
    return MedianDifference(ma, mb, mb - ma, lo, hi, resamples)


# --- the comparison --------------------------------------------------------------------------


def _signed_s(s: float) -> str:
    return ("+" if s > 0 else "-" if s < 0 else "±") + fmt_seconds(abs(s))


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


#: (key, label, how to read the figure from a RunData, how to show it, a difference in seconds?)
def _figures(r: RunData) -> dict[str, float | None]:
    s = r.summary
    ledger = r.report.ledger or {}
    buckets = ledger.get("buckets_s") or {}
    wall = _num(ledger.get("wall_s"))  # the wall time the ledger's buckets add up to
    peaks = [p for p in (_num(d.peak_bytes) for d in s.memory.devices) if p is not None]
    return {
        "wall_time_s": wall if wall is not None else _num(r.run.duration_s),
        "goodput": _num(ledger.get("goodput")),
        **{f"ledger_{b}_s": _num(buckets.get(b)) for b in BUCKETS},
        "step_time_p50_s": _num(s.step_time_p50_s),
        "step_time_p95_s": _num(s.step_time_p95_s),
        "steps_per_s": _num(s.steps_per_s),
        "examples_per_s": _num(s.examples_per_s),
        "input_wait_share": _num(s.input_wait_share),
        "steps": _num(s.steps),
        "last_loss": _num(s.last_loss),
        "host_rss_peak_bytes": _num(s.memory.host_rss_peak_bytes),
        "device_peak_bytes": max(peaks) if peaks else None,
    }


_ROWS: list[tuple[str, str]] = [
    ("wall_time_s", "wall time"),
    ("steps", "steps"),
    ("step_time_p50_s", "step time p50"),
    ("step_time_p95_s", "step time p95"),
    ("steps_per_s", "steps/s"),
    ("examples_per_s", "examples/s"),
    ("input_wait_share", "input wait, of step time"),
    ("last_loss", "last loss"),
    ("host_rss_peak_bytes", "host RSS peak"),
    ("device_peak_bytes", "device memory peak (largest)"),
    ("goodput", "goodput, of wall time"),
    *((f"ledger_{b}_s", f"  {LABELS[b]}") for b in BUCKETS),
]
#: A ledger bucket shorter than this in every run is left out of the table (it says nothing).
_MIN_BUCKET_S = 0.05


def _show(key: str, v: float | None) -> str:
    if v is None:
        return UNKNOWN
    if key == "wall_time_s":
        return fmt_duration(v)
    if key.startswith("ledger_"):
        return fmt_seconds(v)
    if key == "goodput":
        return percent(v)
    if key.endswith("_s") and key.startswith("step_time"):
        return fmt_seconds(v)
    if key == "steps_per_s":
        return fmt_rate(v, "")
    if key == "examples_per_s":
        return fmt_rate(v, "")
    if key == "input_wait_share":
        return percent(v)
    if key == "steps":
        return f"{v:,.0f}"
    if key.endswith("_bytes"):
        return size(v)
    return f"{v:.4g}"


def _delta(key: str, base: float | None, other: float | None) -> str:
    if base is None or other is None:
        return ""
    d = other - base
    if key in ("input_wait_share", "goodput"):
        return f"{100 * d:+.0f} pt"
    if key in ("last_loss",):
        return f"{d:+.4g}"
    rel = f" ({d / base:+.0%})" if base else ""
    if key.endswith("_bytes"):
        return ("+" if d > 0 else "-" if d < 0 else "±") + size(abs(d)) + rel
    if key == "steps" or abs(d) >= 100:
        return f"{d:+,.0f}{rel}"
    if key in ("wall_time_s", "step_time_p50_s", "step_time_p95_s") or key.startswith("ledger_"):
        return _signed_s(d) + rel
    return f"{d:+.3g}{rel}"


def _settings(r: RunData) -> dict[str, str]:
    run = r.run
    return {
        "script": str(run.script or ""),
        "argv": " ".join(run.argv),
        "TensorFlow": str(run.tf_version or ""),
        "Keras": str(run.keras_version or ""),
        "strategy": str(run.strategy or ""),
        "replicas": "" if run.replicas is None else str(run.replicas),
        "workers": "" if run.num_workers in (None, 1) else str(run.num_workers),
        "device": str(run.device_kind or ""),
        "global batch": "" if run.global_batch_size is None else str(run.global_batch_size),
        "mixed precision": "" if run.mixed_precision in (None, "") else str(run.mixed_precision),
        "status": str(run.status or ""),
    }


def _finding_keys(r: RunData) -> dict[tuple[str, str], FindingRow]:
    """A run's findings by (rule, worker); the worker only where the run has several (one
    run's ``host:pid`` is never another's)."""
    several = (r.run.num_workers or 1) > 1
    out: dict[tuple[str, str], FindingRow] = {}
    for f in r.report.findings:
        out.setdefault((f.rule, (f.worker or "") if several else ""), f)
    return out


#: The evidence that says how large a finding is, per rule: (key, how it is written).
_SIZES: dict[str, tuple[str, str]] = {
    "host-memory-growth": ("mib_per_step", "+{} MiB/step"),
    "input-bound": ("input_wait_pct", "{}% input wait"),
    "host-bound": ("host_between_steps_pct", "{}% host between steps"),
    "retrace-storm": ("excess_traces", "{} extra traces"),
    "step-time-jitter": ("p95_over_p50", "p95 {}x p50"),
}


def _finding_size(f: FindingRow) -> str:
    """How large a finding is, in its rule's own figure ("+83 MiB/step"); "" for a rule without
    one. A host-memory finding from the time fit gives MB/min."""
    key, form = _SIZES.get(f.rule, ("", ""))
    ev = json_safe(f.evidence)  # as the JSON writes it ("NaN")
    v = ev.get(key) if key else None
    if v is None and f.rule == "host-memory-growth" and ev.get("slope_mb_per_min") is not None:
        return f"+{ev['slope_mb_per_min']} MB/min"
    return form.format(v) if v is not None else ""


def compare(runs: list[RunData]) -> dict[str, Any]:
    """The comparison of ``runs`` (at least two), each against the first, as plain data."""
    base = runs[0]
    figures = {r.label: _figures(r) for r in runs}
    notes: list[str] = []
    for r in runs:
        status = r.run.status
        if not r.times and not r.summary.steps:
            notes.append(f"{r.label} has no training steps: its step time, speed and losses are not compared")
        elif status in ("crashed", "lost"):
            notes.append(f"{r.label} {status} after {r.summary.steps:,} steps: its wall time and "
                         "step count are not those of a whole run")
        elif status == "running":
            notes.append(f"{r.label} is still running: its figures are as of now")
    settings = {r.label: _settings(r) for r in runs}
    for r in runs[1:]:
        a, b = settings[base.label], settings[r.label]
        if a["script"] and b["script"] and Path(a["script"]).name != Path(b["script"]).name:
            notes.append(f"{base.label} and {r.label} run different scripts ({a['script']} vs {b['script']}): "
                         "step times and losses measure different work")
        if a["replicas"] and b["replicas"] and a["replicas"] != b["replicas"]:
            notes.append(f"{base.label} has {a['replicas']} replicas and {r.label} {b['replicas']}: a step is "
                         "different work; compare examples/s, not step time")
    differences = [
        {"setting": k, "values": {r.label: settings[r.label][k] for r in runs}}
        for k in settings[base.label]
        if k != "status" and len({settings[r.label][k] for r in runs}) > 1
    ]
    medians = []
    for r in runs[1:]:
        d = median_difference(base.times, r.times)
        medians.append({
            "base": base.label, "other": r.label,
            **({"compared": False} if d is None else {
                "compared": True, "base_median_s": d.base_s, "other_median_s": d.other_s,
                "difference_s": d.diff_s, "ci95_low_s": d.low_s, "ci95_high_s": d.high_s,
                "relative": d.relative if math.isfinite(d.relative) else None, "significant": d.significant,
                "method": (f"moving-block bootstrap over steps, {d.resamples} resamples, seed {SEED}; it "
                           "covers the variation within each run, not between runs: two runs of one script "
                           "on a busy machine can differ by more"),
                "text": d.describe(base.label, r.label)}),
        })
    base_findings = _finding_keys(base)
    only = []
    for r in runs[1:]:
        other = _finding_keys(r)
        for who, mine, theirs in ((base.label, base_findings, other), (r.label, other, base_findings)):
            for key, f in mine.items():
                if key not in theirs:
                    only.append({"only_in": who, "vs": r.label if who == base.label else base.label,
                                 "rule": f.rule, "severity": f.severity, "worker": key[1],
                                 "message": f.message})
    changed = []
    for r in runs[1:]:
        other = _finding_keys(r)
        for key, f in base_findings.items():
            g = other.get(key)
            if g is None:
                continue
            before, after = _finding_size(f), _finding_size(g)
            if f.severity == g.severity and before == after:
                continue
            changed.append({
                "base": base.label, "other": r.label, "rule": f.rule, "worker": key[1],
                "base_severity": f.severity, "other_severity": g.severity,
                "base_size": before, "other_size": after,
                "text": f"{f.rule} {f.severity}{' ' + before if before else ''} -> "
                        f"{g.severity}{' ' + after if after else ''}",
                "base_message": f.message, "other_message": g.message})
    return {
        "runs": [{"label": r.label, "id": r.run.id, "dir": r.run.dir,
                  "status": r.run.status, "figures": figures[r.label]} for r in runs],
        "step_time_median_difference": medians,
        "findings_only_in_one": only,
        "findings_changed": changed,
        "setting_differences": differences,
        "not_compared": notes,
        "losses": {r.label: sorted(r.losses.items()) for r in runs},
    }


# --- the gate --------------------------------------------------------------------------------


def gate(data: dict[str, Any], max_regression_pct: float) -> dict[str, Any]:
    """The verdict of ``compare BASE NEW --max-regression PCT`` (two runs): "regression" (exit 1)
    when NEW's step-time median is slower than BASE's by more than PCT % and the whole 95 %
    interval of the difference lies above PCT %; "ok" (exit 0) otherwise; "not judged" (exit 2)
    when either run has fewer than 2 step records. ``text``: one line for CI."""
    (d,) = data["step_time_median_difference"]
    head = f"compare --max-regression {max_regression_pct:g}%"
    if not d["compared"] or not d["base_median_s"]:
        return {"max_regression_pct": max_regression_pct, "verdict": "not judged", "exit_code": 2,
                "text": f"{head}: not judged: {d['other']} or {d['base']} has fewer than 2 step records"}
    base = d["base_median_s"]
    rel, low, high = 100 * d["difference_s"] / base, 100 * d["ci95_low_s"] / base, 100 * d["ci95_high_s"] / base
    figures = (f"{d['other']}'s step-time median {fmt_seconds(d['other_median_s'])} vs {d['base']}'s "
               f"{fmt_seconds(base)}: {rel:+.1f}% (95% CI {low:+.1f}% .. {high:+.1f}%)")
    regression = rel > max_regression_pct and low > max_regression_pct
    if regression:
        text = f"{head}: REGRESSION: {figures}, slower by more than {max_regression_pct:g}%"
    elif rel > max_regression_pct:
        text = f"{head}: ok: {figures}; the interval reaches {max_regression_pct:g}%, not a proven regression"
    else:
        text = f"{head}: ok: {figures}, within {max_regression_pct:g}%"
    return {"max_regression_pct": max_regression_pct, "verdict": "regression" if regression else "ok",
            "exit_code": 1 if regression else 0, "relative_pct": rel, "ci95_low_pct": low, "ci95_high_pct": high,
            "text": text}


# --- rendering -------------------------------------------------------------------------------


def loss_chart(losses: dict[str, list[tuple[int, float]]], width: int = CHART_WIDTH,
               height: int = CHART_HEIGHT) -> list[str]:
    """Every run's loss by step in one character chart: run A drawn with ``a``, B with ``b``, ...
    (``*`` where runs share a cell); x is the step, y the loss. Empty when no run has losses."""
    series = {label: pts for label, pts in losses.items() if pts}
    if not series:
        return []
    steps = [s for pts in series.values() for s, _ in pts]
    values = [v for pts in series.values() for _, v in pts]
    s0, s1 = min(steps), max(steps)
    lo, hi = min(values), max(values)
    if hi == lo:
        hi = lo + 1.0
    grid = [[" "] * width for _ in range(height)]
    for i, (label, pts) in enumerate(series.items()):
        mark = MARKS[i % len(MARKS)] if label not in MARKS.upper() else label.lower()
        cols: dict[int, list[float]] = {}
        for s, v in pts:
            c = 0 if s1 == s0 else round((s - s0) / (s1 - s0) * (width - 1))
            cols.setdefault(c, []).append(v)
        for c, vs in cols.items():
            v = sum(vs) / len(vs)
            r = height - 1 - round((v - lo) / (hi - lo) * (height - 1))
            grid[r][c] = mark if grid[r][c] in (" ", mark) else "*"
    label_w = max(len(f"{hi:.4g}"), len(f"{lo:.4g}"))
    out = []
    for r, row in enumerate(grid):
        y = f"{hi:.4g}" if r == 0 else f"{lo:.4g}" if r == height - 1 else ""
        out.append(f"{y:>{label_w}} |{''.join(row).rstrip()}")
    out.append(" " * label_w + " +" + "-" * width)
    left, right = f"step {s0:,}", f"step {s1:,}"
    out.append(" " * (label_w + 2) + left + " " * max(1, width - len(left) - len(right)) + right)
    return out


def _table(data: dict[str, Any]) -> list[list[str]]:
    runs = data["runs"]
    base = runs[0]
    header = ["", *(r["label"] for r in runs), *(f"{r['label']} - {base['label']}" for r in runs[1:])]
    rows = [header]
    for key, title in _ROWS:
        values = [r["figures"].get(key) for r in runs]
        if key.startswith("ledger_") and all(v is None or abs(v) < _MIN_BUCKET_S for v in values):
            continue
        b = base["figures"][key]
        rows.append([title, *(_show(key, r["figures"][key]) for r in runs),
                     *(_delta(key, b, r["figures"][key]) for r in runs[1:])])
    return rows


def _sections(data: dict[str, Any]) -> list[tuple[str, list[str]]]:
    runs = data["runs"]
    out: list[tuple[str, list[str]]] = [
        ("Runs", [f"{r['label']}: {r['id']} ({r['status']}) {r['dir']}" for r in runs]),
    ]
    diff_lines = []
    for d in data["step_time_median_difference"]:
        if d["compared"]:
            diff_lines.append(d["text"])
            diff_lines.append(f"  ({d['method']})")
        else:
            diff_lines.append(f"step time {d['other']} vs {d['base']}: not compared (a run has fewer than 2 "
                              "step records)")
    out.append(("Step time", diff_lines))
    chart = loss_chart({k: [tuple(p) for p in v] for k, v in data["losses"].items()})
    legend = ", ".join(f"{r['label'].lower()} = {r['label']}" for r in runs if data["losses"].get(r["label"]))
    out.append(("Loss by step", [*chart, f"({legend}; * = several)"] if chart else ["no losses recorded"]))
    only = [f"only in {o['only_in']} (not {o['vs']}): [{o['severity']}] {o['rule']}"
            + (f" on {o['worker']}" if o["worker"] else "") + f": {o['message']}"
            for o in data["findings_only_in_one"]]
    changed = [f"{c['text']} ({c['base']} -> {c['other']})" + (f" on {c['worker']}" if c["worker"] else "")
               for c in data["findings_changed"]]
    if changed:
        out.append(("Findings that changed", changed))
    out.append(("Findings in one run only", only or [
        "none: the runs have the same findings" + (", which changed as above" if changed else "")]))
    settings = [f"{d['setting']}: " + "; ".join(f"{k} {v or UNKNOWN}" for k, v in d["values"].items())
                for d in data["setting_differences"]]
    out.append(("Differences in setup", settings or ["none"]))
    if data["not_compared"]:
        out.append(("Not compared", data["not_compared"]))
    return out


def render_text(data: dict[str, Any]) -> str:
    rows = _table(data)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["Figures"]
    for r in rows:
        lines.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                      for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    lines.append("")
    for title, body in _sections(data):
        lines.append(title)
        lines.extend(f"  {ln}" for ln in body)
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render_markdown(data: dict[str, Any]) -> str:
    rows = _table(data)
    lines = ["# tpuwatch compare", "", "| " + " | ".join(rows[0]) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(rows[0]))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    lines.append("")
    for title, body in _sections(data):
        lines.append(f"## {title}")
        lines.append("")
        if title == "Loss by step":
            lines += ["```", *body, "```"]
        else:
            lines += [f"- {ln}" for ln in body]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, allow_nan=False, default=str)

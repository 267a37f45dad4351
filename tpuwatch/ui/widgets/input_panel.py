"""Input pipeline: how much of each step waits for data.

The numbers and the verdict are the diagnostics' own (``snapshot.input_wait``, defined in
``tpuwatch.monitor.diagnostics.input_share``; the last 30 s while the run goes on, the whole run
once it has ended, and the panel says which): xprof's 5 % / 20 % of step time (a wait under
0.1 ms per step is noise) and 20 steps of evidence, so the panel never contradicts the ``input-bound`` finding.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import Static

from tpuwatch import units
from tpuwatch.monitor.diagnostics.input_share import InputLevel
from tpuwatch.monitor.diagnostics.pipeline_doctor import pipeline_notes
from tpuwatch.monitor.diagnostics.thresholds import Thresholds
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.ui.widgets.history_bars import BarSeries, HistoryBars
from tpuwatch.ui.widgets.panel import EXPANDED_ROWS, Panel

WaitLevel = InputLevel
_TH = Thresholds()


def input_level(s: RunSnapshot) -> WaitLevel:
    """The verdict of the ``input-bound`` rule now ("unknown" until the findings were first
    evaluated)."""
    return s.input_wait.level if s.input_wait is not None else "unknown"


_STYLE: dict[WaitLevel, str] = {"high": "$error bold", "moderate": "$warning bold", "low": "", "unknown": "dim"}


def input_style(s: RunSnapshot) -> str:
    return _STYLE[input_level(s)]


_VERDICT = {
    "high": "highly input-bound (≥20%)",
    "moderate": "moderately input-bound (≥5%)",
    "low": "not input-bound (<5%)",
    "unknown": "input wait not measured",
}


#: What the ``w`` strip is and its scale (the expanded Step time and Input panels; the help).
WAIT_LEGEND = "w: input wait, share of each step (full height 100%)"


def wait_series(s: RunSnapshot) -> BarSeries:
    """Input-wait share of each history point, 0..1 (same buckets as the step-time plot)."""
    values = tuple(
        None if p.input_wait_s is None or p.step_time_s <= 0 else min(1.0, p.input_wait_s / p.step_time_s)
        for p in s.history
    )
    # The bottom label carries the current share: at 80x24 the plot is one row high.
    name = f"w {units.percent(s.input_wait_frac)}" if s.input_wait_frac is not None else "wait"
    # Steps, or an ended run, without a wait: not coming (no tf.data input), not "yet".
    measured = s.history or s.status in ("finished", "stopped", "crashed", "lost")
    # No "100%" over the strip: a lone figure there read as unexplained; WAIT_LEGEND says it.
    return BarSeries(values, 0.0, 1.0, name=name, reduce="mean",
                     empty="not measured" if measured else "no data yet")


def pipeline_map_text(s: RunSnapshot, width: int = 1000) -> list[Content]:
    """The pipeline map (expanded panel): each dataset's stages from the source on, with the
    script's line, settings and what a stage holds; the stage the ``input-bound`` finding blames
    in its colour, with the edit. A stage is one line within ``width`` (its settings cut with
    "…": a wrapped one fell under the next stage's column; ``tpuwatch report`` has them whole)."""
    culprit = next(((f.evidence.get("culprit_site"), f.evidence.get("culprit_stage"), f.advice, f.severity)
                    for f in s.findings if f.rule == "input-bound" and f.evidence.get("culprit_stage")), None)
    lines: list[Content] = []
    for worker, p in s.pipelines:
        head = f"dataset {p.dataset} · {p.consumer}" + (f" · {worker}" if s.num_workers > 1 else "")
        lines.append(Content.styled(head, "bold"))
        for stage, site, settings, held, by in zip(p.stages, p.sites, p.settings, p.holds_bytes, p.added_by):
            blamed = culprit is not None and (site, stage) == culprit[:2]
            extra = "".join([f" · added by {by}" if by else "",
                             f" · holds ≤{units.size(held)}" if held > 0 else ""])
            line = Content.assemble((f"  {site or '?':<24} ", "dim"),
                                    (f".{stage}({settings})", _FINDING_STYLE.get(culprit[3], "")
                                     if blamed and culprit else ""),
                                    (extra, "dim"))
            if line.cell_length > width:
                line = line.truncate(max(1, width - 1)) + Content("…")
            lines.append(line)
            if blamed and culprit:
                lines.append(Content.styled(f"    ← {culprit[2]}", _FINDING_STYLE.get(culprit[3], "")))
        lines += [Content.styled(f"  ({note})", "dim") for note in pipeline_notes(p)]
    return lines


_FINDING_STYLE = {"critical": "$error bold", "warning": "$warning bold", "info": "bold"}


def input_text(s: RunSnapshot, expanded: bool = False, width: int = 1000) -> Content:
    lines = _wait_lines(s)
    # the map is known from the first fetch on, with or without a judged wait
    if expanded and s.pipelines:
        lines += [Content(""), *pipeline_map_text(s, width)]
    return Content("\n").join(lines)


def _wait_lines(s: RunSnapshot) -> list[Content]:
    if s.step_time_s is None:
        return [Content.styled("no steps yet", "dim")]
    share = s.input_wait
    level = input_level(s)
    style = _STYLE[level]
    if share is None:
        # The Step-time panel draws each step's wait from the first step on; the share is the
        # diagnostics' own, judged only from its first 20 measured steps.
        if any(p.input_wait_s is not None for p in s.history):
            return [Content.styled(f"input wait measured; too few steps to judge ({_TH.input_min_records} needed)",
                                   "dim")]
        return [Content.styled(_VERDICT["unknown"], "dim")]
    verdict = _VERDICT[level] if level != "unknown" else f"too few steps to judge ({share.steps} of 20)"
    if level == "low" and share.share >= _TH.input_info_frac:
        verdict = "not input-bound (<0.1 ms/step)"  # a large share of a microsecond step: noise
    lines = [
        Content.assemble(("wait ", "dim"), (units.percent(share.share), style), ("  of step time", "dim")),
        Content.styled(verdict, style or "dim"),
        # means (the share is their ratio), not the Step time panel's p50
        Content.assemble(("mean ", "dim"), units.duration(share.wait_per_step_s), (" of ", "dim"),
                         units.duration(share.step_time_s), (f" per step · {share.steps} steps", "dim")),
    ]
    if s.input_scope:
        lines.append(Content.styled(s.input_scope, "dim"))
    return lines


class InputPanel(Panel):
    TITLE = "5 Input pipeline"  # the number key that jumps here

    def compose(self) -> ComposeResult:
        yield Static(classes="body", markup=False)
        yield HistoryBars(id="input-bars")

    def body(self, snapshot: RunSnapshot, rows: int, width: int) -> Content:
        text = input_text(snapshot, expanded=rows >= EXPANDED_ROWS, width=width)
        if rows >= EXPANDED_ROWS and snapshot.history:
            text = Content("\n").join([text, Content.styled(WAIT_LEGEND, "dim")])
        return text

    def state(self, snapshot: RunSnapshot) -> str | None:
        level = input_level(snapshot)
        return {"high": "-critical", "moderate": "-warning"}.get(level)

    def update_extra(self, snapshot: RunSnapshot) -> None:
        self.query_one("#input-bars", HistoryBars).series = wait_series(snapshot)

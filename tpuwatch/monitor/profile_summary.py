"""A terminal summary of a profile capture, computed WITHOUT TensorFlow (the ``xprof`` package).

``xprof.convert.raw_to_tool_data.xspace_to_tool_data(paths, tool, {})`` returns ``(bytes, mime)``
where the bytes are a JSON list of Google-Charts DataTables (``{"cols", "rows", "p"}``):

- ``overview_page``: table 1 (columns ``stepnum``, ``hostComputeTimeMs``, ``infeedTimeMs``, …,
  ``stepTimeMs``) has one row per step marker, and its ``p`` the averages
  (``steptime_ms_average``, ``infeed_time_ms_avg``…) and ``input_conclusion`` (xprof's input-bound
  verdict: ≥5% of the step waiting for input is "moderately", ≥20% "highly"); table 3's ``p`` has
  the ``bottleneck`` and its ``statement``;
- ``framework_op_stats``: table 0 has one row per op with ``total_self_time`` (µs).

Conversion takes 0.01-0.3 s for a few steps. xprof's native code logs at INFO level to stderr,
which would draw over a dashboard: ``TF_CPP_MIN_LOG_LEVEL`` is raised before it is imported.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from tpuwatch.monitor.diagnostics.input_share import InputShare

InputVerdict = Literal["highly", "moderately", "not", "unknown"]

#: Step-time components of xprof's overview, in its order: (column id, label).
BREAKDOWN = (
    ("deviceComputeTimeMs", "device compute"),
    ("deviceToDeviceTimeMs", "device to device"),
    ("deviceCollectivesTimeMs", "collectives"),
    ("hostComputeTimeMs", "host compute"),
    ("kernelLaunchTimeMs", "kernel launch"),
    ("infeedTimeMs", "input"),
    ("outfeedTimeMs", "output"),
    ("compileTimeMs", "compilation"),
    ("otherTimeMs", "other"),
)
TOP_OPS = 8


class ProfileSummaryError(Exception):
    """The profile cannot be summarised; the message says why and what to do."""


@dataclass(frozen=True)
class StepBreakdown:
    name: str  # xprof's step label, e.g. "train 14"
    step_ms: float
    parts_ms: tuple[tuple[str, float], ...]  # (component label, ms), zero components left out


@dataclass(frozen=True)
class OpTime:
    name: str
    op_type: str
    where: str  # "Host" or "Device"
    self_ms: float
    share: float  # of the self time of all ops (idle excluded), 0..1
    occurrences: int


@dataclass(frozen=True)
class ProfileSummary:
    path: str  # the capture directory (…/plugins/profile/<timestamp>)
    logdir: str  # what to point TensorBoard / XProf at
    hardware: str
    steps: tuple[StepBreakdown, ...]
    step_avg_ms: float | None
    step_min_ms: float | None
    step_max_ms: float | None
    average_ms: tuple[tuple[str, float], ...]  # mean per component over the steps
    input_percent: float | None  # share of the step waiting for input, 0..100
    input_verdict: InputVerdict
    input_conclusion: str
    bottleneck: str
    top_ops: tuple[OpTime, ...]
    open_commands: tuple[str, ...]


def capture_files(profile_dir: Path) -> list[Path]:
    return sorted(profile_dir.glob("*.xplane.pb"))


def _convert(paths: list[str], tool: str) -> list[dict[str, Any]]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        from xprof.convert import raw_to_tool_data
    except ImportError as e:
        raise ProfileSummaryError(f"summaries need the xprof package (pip install 'tpuwatch[profile]' or "
                                  f"pip install xprof): {e}") from None
    try:
        data, _ = raw_to_tool_data.xspace_to_tool_data(paths, tool, {})
    except Exception as e:
        raise ProfileSummaryError(f"xprof could not read the capture ({tool}): {type(e).__name__}: {e}") from None
    if not data:
        return []
    try:
        tables = json.loads(data)
    except ValueError as e:
        raise ProfileSummaryError(f"xprof returned something that is not JSON for {tool}: {e}") from None
    return tables if isinstance(tables, list) else [tables]


def _float(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip().rstrip("%"))
        except ValueError:
            return None
    return None


def _rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    """A DataTable's rows as {column id: value}."""
    ids = [c.get("id", "") for c in table.get("cols", [])]
    out = []
    for row in table.get("rows", []) or []:
        cells = row.get("c", []) if isinstance(row, dict) else []
        out.append({ids[i]: (c or {}).get("v") for i, c in enumerate(cells) if i < len(ids)})
    return out


def _find(tables: list[dict[str, Any]], column: str) -> dict[str, Any] | None:
    for t in tables:
        if any(c.get("id") == column for c in t.get("cols", [])):
            return t
    return None


def verdict_of(conclusion: str, input_percent: float | None) -> InputVerdict:
    text = conclusion.lower()
    if "highly" in text:
        return "highly"
    if "moderately" in text:
        return "moderately"
    if "not input-bound" in text or "not input bound" in text:
        return "not"
    if input_percent is None:
        return "unknown"
    # xprof's own thresholds when it gave no sentence.
    return "highly" if input_percent >= 20 else "moderately" if input_percent >= 5 else "not"


#: The pyproject extra that installs each viewer (xprof also is TensorBoard's profile plugin).
VIEWER_EXTRAS = {"xprof": "profile", "tensorboard": "profile,tensorboard"}


def open_commands(logdir: str) -> tuple[str, ...]:
    """The commands that open a capture, each with the install that brings its tool as a shell
    comment (pasting the line still runs only the command)."""
    quoted = shlex.quote(logdir)
    return (f"xprof server --logdir={quoted} --port=8791  # pip install 'tpuwatch[{VIEWER_EXTRAS['xprof']}]'",
            f"tensorboard --logdir={quoted}  # pip install 'tpuwatch[{VIEWER_EXTRAS['tensorboard']}]'")


def summarize(profile_dir: str | os.PathLike[str]) -> ProfileSummary:
    """Summarises one capture directory (``<logdir>/plugins/profile/<timestamp>``).

    Raises ProfileSummaryError (missing directory, no .xplane.pb, xprof missing or failing).
    """
    directory = Path(profile_dir)
    files = capture_files(directory)
    if not files:
        raise ProfileSummaryError(f"no .xplane.pb in {directory} (is it a plugins/profile/<timestamp> directory?)")
    paths = [str(p) for p in files]
    logdir = str(directory.parents[2]) if len(directory.parents) >= 3 and directory.parent.name == "profile" \
        else str(directory)

    overview = _convert(paths, "overview_page")
    step_table = _find(overview, "stepnum") or {}
    p = step_table.get("p", {}) or {}
    steps = []
    for row in _rows(step_table):
        parts = tuple((label, round(v, 3)) for col, label in BREAKDOWN
                      if (v := _float(row.get(col))) is not None and v > 0)
        total = _float(row.get("stepTimeMs")) or sum(v for _, v in parts)
        steps.append(StepBreakdown(str(row.get("stepnum", "")), round(total, 3), parts))
    averages = []
    for col, label in BREAKDOWN:
        key = re.sub(r"([A-Z])", r"_\1", col.replace("TimeMs", "")).lower() + "_time_ms_avg"
        value = _float(p.get(key))
        if value is None and steps:
            vals = [dict(s.parts_ms).get(label, 0.0) for s in steps]
            value = sum(vals) / len(vals)
        if value:
            averages.append((label, value))
    step_avg = _float(p.get("steptime_ms_average"))
    if step_avg is None and steps:
        step_avg = sum(s.step_ms for s in steps) / len(steps)
    infeed = _float(p.get("infeed_time_ms_avg"))
    input_percent = 100.0 * infeed / step_avg if infeed is not None and step_avg else None
    conclusion = str(p.get("input_conclusion", "") or "")
    tips = _find(overview, "tip_type") or {}
    bottleneck = str((tips.get("p") or {}).get("statement", "") or "")

    ops_tables = _convert(paths, "framework_op_stats")
    op_table = _find(ops_tables, "total_self_time") or {}
    ops = [r for r in _rows(op_table) if str(r.get("type", "")).upper() != "IDLE"]
    total_self = sum(_float(r.get("total_self_time")) or 0.0 for r in ops) or 1.0
    ops.sort(key=lambda r: _float(r.get("total_self_time")) or 0.0, reverse=True)
    top = tuple(
        OpTime(name=str(r.get("operation", "")), op_type=str(r.get("type", "")), where=str(r.get("host_or_device", "")),
               self_ms=(_float(r.get("total_self_time")) or 0.0) / 1000.0,
               share=(_float(r.get("total_self_time")) or 0.0) / total_self,
               occurrences=int(_float(r.get("occurrences")) or 0))
        for r in ops[:TOP_OPS]
    )
    return ProfileSummary(
        path=str(directory), logdir=logdir, hardware=str(p.get("hardware_type", "") or ""),
        steps=tuple(steps), step_avg_ms=step_avg,
        step_min_ms=_float(p.get("steptime_ms_minimum")), step_max_ms=_float(p.get("steptime_ms_maximum")),
        average_ms=tuple(averages), input_percent=input_percent,
        input_verdict=verdict_of(conclusion, input_percent), input_conclusion=conclusion,
        bottleneck=bottleneck, top_ops=top, open_commands=open_commands(logdir),
    )


def render_text(s: ProfileSummary, width: int = 100, live: "InputShare | None" = None) -> str:
    """The summary as plain text lines (the CLI prints it; the dashboard shows it in a modal).

    ``live``: tpuwatch's own input-wait measurement over the latest steps (the ``input-bound``
    finding's numbers). xprof's input share counts only the time the compiled step waits for
    infeed; the wait of an eager ``for x in dist_dataset`` fetch happens between two compiled
    steps and is not in it, so both are shown, each saying what it measures, and the verdict is
    the worse of the two.
    """
    lines = [f"Profile {s.path}" + (f" ({s.hardware})" if s.hardware else "")]
    if s.steps:
        rng = ""
        if s.step_min_ms is not None and s.step_max_ms is not None:
            rng = f" (min {s.step_min_ms:.1f}, max {s.step_max_ms:.1f})"
        avg = f"{s.step_avg_ms:.1f} ms" if s.step_avg_ms is not None else "?"
        lines.append(f"  {len(s.steps)} steps, step time {avg} on average{rng}")
        if s.average_ms and s.step_avg_ms:
            parts = ", ".join(f"{label} {ms:.1f} ms ({100 * ms / s.step_avg_ms:.0f}%)"
                              for label, ms in sorted(s.average_ms, key=lambda x: -x[1]))
            lines.append(f"  breakdown: {parts}")
        for st in s.steps:
            parts = ", ".join(f"{label} {ms:.1f}" for label, ms in st.parts_ms)
            lines.append(f"    {st.name:<12} {st.step_ms:8.1f} ms  {parts}"[:width])
    else:
        lines.append("  no step markers in this capture: no per-step breakdown (was a training step running?)")
    verdict = {"highly": "HIGHLY input-bound", "moderately": "moderately input-bound", "not": "not input-bound",
               "unknown": "input-bound: unknown"}[s.input_verdict]
    pct = f" ({s.input_percent:.0f}% of the step waiting for input)" if s.input_percent is not None else ""
    if live is None:
        lines.append(f"  input: {verdict}{pct}")
    else:
        lines.append(f"  input inside the compiled step (this profile): {verdict}{pct}")
        live_verdict = {"high": "HIGHLY input-bound", "moderate": "moderately input-bound",
                        "low": "not input-bound", "unknown": "too few steps to judge"}[live.level]
        lines.append(f"  input measured live, every fetch incl. eager ones between steps: {live_verdict} "
                     f"({live.describe()})")
        rank = {"highly": 2, "moderately": 1, "not": 0, "unknown": -1}
        live_rank = {"high": 2, "moderate": 1, "low": 0, "unknown": -1}[live.level]
        if live_rank > rank[s.input_verdict]:
            lines.append("  verdict: input-bound - the wait happens outside the compiled step (an eager "
                         "fetch from the dataset between steps), which the profile does not count")
    if s.bottleneck and s.bottleneck != s.input_conclusion:
        lines.append(f"  {s.bottleneck}"[:width * 2])
    if s.top_ops:
        # A Keras model's ops share a long scope (StatefulPartitionedCall/functional_1/xception_1/):
        # said once, so that each row keeps the part that tells it apart, cut from the left.
        shared = _shared_scope([op.name for op in s.top_ops])
        lines.append("  top ops by self time" + (f", each under {shared}:" if shared else ":"))
        names = [op.name[len(shared):] for op in s.top_ops]
        # the op's type goes first where a name would not fit beside it (a name ends in its type)
        with_type = 4 + 13 + 8 + 7 + 21 + max(map(len, names)) <= width
        for op, name in zip(s.top_ops, names):
            row = f"    {op.self_ms:9.2f} ms {100 * op.share:5.1f}%  {op.where:<6} " + (
                f"{op.op_type:<20} " if with_type else "")
            room = width - len(row)
            if len(name) > room:
                name = "…" + name[len(name) - max(room, 8) + 1:]
            lines.append(row + name)
    lines.append("  open it with:")
    lines.extend(f"    {c}" for c in s.open_commands)
    return "\n".join(lines)


def _shared_scope(names: list[str]) -> str:
    """The scope (up to a ``/``) every one of two or more op names begins with; "" when none."""
    if len(names) < 2:
        return ""
    prefix = os.path.commonprefix(names)
    return prefix[:prefix.rfind("/") + 1]


def recent_input_share(run_dir: Path, nbytes: int = 4 * 1024 * 1024) -> InputShare | None:
    """Input wait over the latest steps of a run (the ``input-bound`` rule's window and
    definition), from the last ``nbytes`` of its recording: what ``tpuwatch profile`` shows
    beside the profile's own input share."""
    # The engine is imported here: the profile screen needs only the parsing above.
    from tpuwatch.monitor.diagnostics import Engine
    from tpuwatch.monitor.recording import tail_messages
    from tpuwatch.protocol import Finding, Hello

    eng = Engine(clock=lambda: 0.0)
    worker = ""
    for msg in tail_messages(Path(run_dir) / "events.jsonl", nbytes):
        if isinstance(msg, Hello):
            worker = msg.worker
        if not isinstance(msg, Finding):
            eng.apply(msg, worker)
    return eng.input_figures().recent

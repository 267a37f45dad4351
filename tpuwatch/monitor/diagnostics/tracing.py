"""``retrace-storm`` and ``function-recreated``: tf.function tracing that keeps happening."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tpuwatch.protocol import Finding, Message, Retrace, Severity

from .rule import Rule
from .telemetry import Telemetry, WorkerTelemetry
from .thresholds import Thresholds

_SHAPE_CHANGE = re.compile(r"shape\s*\(([^)]*)\)\s*->\s*\(([^)]*)\)")
_MAX_CHANGES = 4  # distinct changes remembered per function


@dataclass
class FunctionHistory:
    name: str
    worker: str
    traces: int = 0
    instances: int = 0
    first_step: int | None = None
    last_step: int | None = None
    excess_first_step: int | None = None  # step of the first trace beyond the allowance
    instances_first_step: int | None = None  # step when instances first reached the bar
    changes: list[str] = field(default_factory=list)
    #: re-traces of existing objects per cause (classify_change's kind)
    causes: dict[str, int] = field(default_factory=dict)
    t: float = 0.0

    def excess(self, allowed_per_instance: int) -> int:
        """Re-traces of existing objects beyond what partial batches explain."""
        return self.traces - self.instances - allowed_per_instance * self.instances


class _TracingRule(Rule):
    observes = (Retrace,)

    def __init__(self, th: Thresholds) -> None:
        super().__init__(th)
        self.functions: dict[tuple[str, str], FunctionHistory] = {}

    def observe(self, msg: Message, w: WorkerTelemetry, tel: Telemetry) -> None:
        assert isinstance(msg, Retrace)
        key = (w.name, msg.function)
        h = self.functions.get(key)
        if h is None:
            h = self.functions[key] = FunctionHistory(msg.function, w.name)
        h.traces = max(h.traces, msg.traces)
        h.instances = max(h.instances, msg.instances, 1)
        h.t = msg.t
        if msg.step is not None:
            if h.first_step is None:
                h.first_step = msg.step
            h.last_step = msg.step
        if msg.change and not msg.change.startswith("new tf.function object"):
            kind = classify_change(msg.change)[0]
            h.causes[kind] = h.causes.get(kind, 0) + 1
        if msg.change and msg.change not in h.changes:
            h.changes.append(msg.change)
            del h.changes[:-_MAX_CHANGES]
        self.on_history(h, msg)

    def on_history(self, h: FunctionHistory, msg: Retrace) -> None:
        """Hook for the rule's own bookkeeping after ``h`` was updated."""


def classify_change(change: str) -> tuple[str, str]:
    """(kind, concrete advice) for one ``Retrace.change`` text."""
    m = _SHAPE_CHANGE.search(change)
    if m:
        a = [d.strip() for d in m.group(1).split(",") if d.strip()]
        b = [d.strip() for d in m.group(2).split(",") if d.strip()]
        differing = [i for i in range(min(len(a), len(b))) if a[i] != b[i]]
        if len(a) == len(b) and differing == [0]:
            return "batch dimension", (
                "only the batch dimension changes: batch with drop_remainder=True, or give the "
                "tf.function an input_signature with a None batch dimension "
                "(or reduce_retracing=True)")
        return "shape", (
            "input shapes change: pad to a few fixed lengths (padded_batch / bucket_by_sequence_"
            "length), or use an input_signature with None for the varying dimensions "
            "(or reduce_retracing=True)")
    if "dtype" in change:
        return "dtype", "input dtypes change: cast inputs to one dtype before the call"
    if change:
        return "python value", (
            "a Python value changes between calls: pass it as a tensor "
            "(tf.constant / a tf.Variable) so one trace serves every value")
    return "unknown", ("give the tf.function an input_signature, or reduce_retracing=True, so "
                       "varying inputs reuse one trace")


class RetraceStorm(_TracingRule):
    """Re-traces of the same function objects beyond one per object (the last partial batch).

    ``traces - instances`` counts traces that are not the first trace of a new object, so a
    function recreated in a loop (its own rule) does not also count as a storm; Keras' train
    and test functions share a name and each may retrace once for a partial batch.
    """

    id = "retrace-storm"

    def on_history(self, h: FunctionHistory, msg: Retrace) -> None:
        th = self.th
        excess = h.excess(th.retrace_allowed_per_instance)
        kind, advice = classify_change(h.changes[-1] if h.changes else "")
        same_cause = h.causes.get(kind, 0)
        if excess >= th.retrace_warning_excess:
            severity: Severity = "critical" if excess >= th.retrace_critical_excess else "warning"
            what = "retrace storm"
        elif same_cause > th.retrace_allowed_per_instance * h.instances:
            # the second re-trace of one object with the same cause is a pattern, not the last
            # partial batch: say so (info) with the fix, before it becomes a storm
            severity, what = "info", f"repeated retraces ({same_cause} for the same cause)"
        else:
            return
        if h.excess_first_step is None:
            h.excess_first_step = msg.step
        last_change = h.changes[-1] if h.changes else ""
        self._keep(f"{h.worker}|{h.name}", Finding(
            t=h.t, rule=self.id, severity=severity,
            message=(f"{what}: tf.function '{h.name}' traced {h.traces} times "
                     f"({h.instances} object{'s' if h.instances != 1 else ''}); "
                     f"changing: {kind}"),
            advice=f"{advice}. Last change: {last_change}" if last_change else advice,
            evidence={
                "function": h.name,
                "traces": h.traces,
                "instances": h.instances,
                "excess_traces": excess,
                "change_kind": kind,
                "same_cause_retraces": same_cause,
                "last_change": last_change,
                "recent_changes": " | ".join(h.changes),
                "warning_threshold_excess": th.retrace_warning_excess,
            },
            first_step=h.excess_first_step, last_step=h.last_step, worker=h.worker,
        ))


class FunctionRecreated(_TracingRule):
    """Many tf.function objects with the same name: the function is built inside a loop."""

    id = "function-recreated"

    def on_history(self, h: FunctionHistory, msg: Retrace) -> None:
        th = self.th
        if h.instances < th.recreated_warning_instances:
            return
        if h.instances_first_step is None:
            h.instances_first_step = msg.step
        severity: Severity = "critical" if h.instances >= th.recreated_critical_instances else "warning"
        self._keep(f"{h.worker}|{h.name}", Finding(
            t=h.t, rule=self.id, severity=severity,
            message=(f"tf.function '{h.name}' was created {h.instances} times "
                     f"(each new object traces again)"),
            advice=(f"Create '{h.name}' once, outside the training loop (at module level or in "
                    "__init__), and call the same object every step; do not wrap a function "
                    "in tf.function inside a loop or per batch"),
            evidence={
                "function": h.name,
                "instances": h.instances,
                "traces": h.traces,
                "warning_threshold_instances": th.recreated_warning_instances,
            },
            first_step=h.instances_first_step, last_step=h.last_step, worker=h.worker,
        ))

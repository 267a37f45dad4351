"""``retrace-storm`` and ``function-recreated``: tf.function tracing that keeps happening."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from tpuwatch.protocol import NEW_OBJECT_CHANGE, VARIABLES_MADE_CHANGE, Finding, Message, Retrace, Severity
from tpuwatch.units import function_label

from .robust_stats import sig
from .rule import Rule
from .telemetry import Telemetry, Worker
from .thresholds import Thresholds

_SHAPE_CHANGE = re.compile(r"shape\s*\(([^)]*)\)\s*->\s*\(([^)]*)\)")
MB = 1 << 20
_TRACED_GROWTH_SHOWN = 8 * MB  # host growth with traces below this is not worth a line
_MAX_CHANGES = 4  # distinct changes remembered per function
_MAX_SIGNATURES = 64  # distinct traced signatures remembered per function (the latest)
#: A tensor input in ``Retrace.signature``: ``float32(32, 8)``, ``int64(None,) x4`` (per replica).
_TENSOR_TEXT = re.compile(r"^(\w+)\((.*)\)(?: x(\d+))?$")
_INT_TEXT = re.compile(r"^-?\d+$")
#: An input's path in a signature: ``x``, ``data[0]``, ``batch['image']``, ``s.lr``, ``x<replica 1>``.
_PATH = re.compile(r"^[A-Za-z_]\w*(?:\[[^\]]*\]|\.\w+|<replica \d+>)*$")


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
    #: inputs of the traces so far ({path: text}, from ``Retrace.signature``), oldest first
    signatures: list[dict[str, str]] = field(default_factory=list)
    t: float = 0.0
    #: the script's line whose call traced last (``Retrace.call_site``) and its source text
    call_site: str = ""
    call_code: str = ""

    #: traces TF made again because a first call created variables (once per object)
    variable_traces: int = 0

    def excess(self, allowed_per_instance: int) -> int:
        """Re-traces of existing objects beyond what partial batches and first calls that
        created variables explain."""
        return self.traces - self.instances - self.variable_traces - allowed_per_instance * self.instances


class _TracingRule(Rule):
    observes = (Retrace,)

    def __init__(self, th: Thresholds) -> None:
        super().__init__(th)
        self.functions: dict[tuple[str, str], FunctionHistory] = {}

    def observe(self, msg: Message, w: Worker, tel: Telemetry) -> None:
        assert isinstance(msg, Retrace)
        label = function_label(msg.function, msg.evaluation)
        key = (w.name, label)
        h = self.functions.get(key)
        if h is None:
            h = self.functions[key] = FunctionHistory(label, w.name)
        h.traces = max(h.traces, msg.traces)
        h.instances = max(h.instances, msg.instances, 1)
        h.t = msg.t
        if msg.call_site:
            h.call_site, h.call_code = msg.call_site, msg.call_code
        if msg.step is not None:
            if h.first_step is None:
                h.first_step = msg.step
            h.last_step = msg.step
        change = msg.change
        if change == VARIABLES_MADE_CHANGE:  # once per object, not a retrace problem
            h.variable_traces += 1
        elif change and change != NEW_OBJECT_CHANGE:
            # the agent's change is against the previous trace; what made TF trace again is
            # what differs from the closest trace it already has
            change = closest_change(h.signatures, msg.signature) or change
            kind = classify_change(change)[0]
            h.causes[kind] = h.causes.get(kind, 0) + 1
        remember_signature(h.signatures, msg.signature)
        if change and change != VARIABLES_MADE_CHANGE and change not in h.changes:
            h.changes.append(change)
            del h.changes[:-_MAX_CHANGES]
        self.on_history(h, msg)

    def on_history(self, h: FunctionHistory, msg: Retrace) -> None:
        """Hook for the rule's own bookkeeping after ``h`` was updated."""


def parse_signature(signature: str) -> dict[str, str] | None:
    """``"xb: float32(32, 8), phase: 1"`` -> ``{"xb": "float32(32, 8)", "phase": "1"}``;
    ``None`` when it cannot be read whole (cut at its length limit, or not ``path: text``)."""
    if not signature or signature.endswith("..."):
        return None
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(signature):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and signature.startswith(", ", i):
            parts.append(signature[start:i])
            start = i + 2
    parts.append(signature[start:])
    out: dict[str, str] = {}
    for part in parts:
        path, sep, text = part.partition(": ")
        if not sep or not _PATH.match(path) or path in out:
            return None
        out[path] = text
    return out


def remember_signature(seen: list[dict[str, str]], signature: str) -> None:
    sig = parse_signature(signature)
    if sig is None:
        return
    if sig in seen:
        seen.remove(sig)
    seen.append(sig)
    del seen[:-_MAX_SIGNATURES]


def closest_change(seen: list[dict[str, str]], signature: str) -> str:
    """What differs between ``signature`` and the closest of the ``seen`` traces (fewest inputs
    differing; the latest of equals), in the agent's words (``xb: shape (5, 8) -> (32, 8)``,
    ``phase: python int 0 -> 1``). "" when nothing is known or nothing differs (another object
    of the same name, a context change): then the agent's own change stands."""
    new = parse_signature(signature)
    if new is None or not seen:
        return ""
    best: dict[str, str] | None = None
    best_d = 0
    for old in seen:
        d = sum(old.get(p) != t for p, t in new.items()) + sum(p not in new for p in old)
        if best is None or d <= best_d:
            best, best_d = old, d
    if best is None or best_d == 0:
        return ""
    parts = [f"new argument {p}" if p not in best else _input_change(p, best[p], t)
             for p, t in new.items() if best.get(p) != t]
    parts += [f"argument {p} removed" for p in best if p not in new]
    return "; ".join(parts)


def _input_change(path: str, old: str, new: str) -> str:
    a, b = _TENSOR_TEXT.match(old), _TENSOR_TEXT.match(new)
    if a and b:
        bits = []
        if a.group(1) != b.group(1):
            bits.append(f"dtype {a.group(1)} -> {b.group(1)}")
        if a.group(2) != b.group(2):
            bits.append(f"shape ({a.group(2)}) -> ({b.group(2)})")
        return f"{path}: " + (", ".join(bits) if bits else f"{old} -> {new}")
    if a or b:
        return f"{path}: " + (f"tensor {old}" if a else _python_text(old)) + " -> " + (
            f"tensor {new}" if b else _python_text(new))
    ta, tb = _python_type(old), _python_type(new)
    if ta == tb:
        return f"{path}: python {ta} {old} -> {new}" if ta != "None" else f"{path}: {old} -> {new}"
    return f"{path}: {_python_text(old)} -> {_python_text(new)}"


def _python_type(text: str) -> str:
    if text in ("None", "True", "False"):
        return "None" if text == "None" else "bool"
    if _INT_TEXT.match(text):
        return "int"
    if text[:1] in ("'", '"'):
        return "str"
    try:
        float(text)
    except ValueError:
        return "value"
    return "float"


def _python_text(text: str) -> str:
    kind = _python_type(text)
    return "python None" if kind == "None" else f"python {kind} {text}"


#: The fix for each kind of change (classify_change's kinds).
_ADVICE: dict[str, str] = {
    "batch dimension": (
        "only the batch dimension changes: batch with drop_remainder=True, or give the "
        "tf.function an input_signature with a None batch dimension "
        "(or reduce_retracing=True)"),
    "shape": (
        "input shapes change: pad to a few fixed lengths (padded_batch / bucket_by_sequence_"
        "length), or use an input_signature with None for the varying dimensions "
        "(or reduce_retracing=True)"),
    "dtype": "input dtypes change: cast inputs to one dtype before the call",
    "python value": (
        "a Python value changes between calls: pass it as a tensor "
        "(tf.constant / a tf.Variable) so one trace serves every value"),
    "unknown": ("give the tf.function an input_signature, or reduce_retracing=True, so "
                "varying inputs reuse one trace"),
}


#: The batch dimension's fix when the script's batch size itself takes several values (more
#: than a full batch and a last partial one): drop_remainder cannot help there.
_VARYING_BATCH_ADVICE = (
    "the batch size itself changes ({n} sizes traced: {sizes}): give the tf.function an "
    "input_signature with a None batch dimension, or reduce_retracing=True, so one trace serves "
    "every size (drop_remainder=True only drops a last partial batch)")
_LEADING_DIM = re.compile(r"^\w+\((\d+)[,)]")


def batch_sizes(h: FunctionHistory) -> list[int]:
    """The distinct leading dimensions of the first input across the traces remembered, in the
    order traced ([] where a signature cannot be read)."""
    sizes: list[int] = []
    for inputs in h.signatures:
        first = next(iter(inputs.values()), "")
        m = _LEADING_DIM.match(first)
        if m is None:
            return []
        size = int(m.group(1))
        if size not in sizes:
            sizes.append(size)
    return sizes


def classify_change(change: str) -> tuple[str, str]:
    """(kind, concrete advice) for one ``Retrace.change`` text."""
    m = _SHAPE_CHANGE.search(change)
    if m:
        a = [d.strip() for d in m.group(1).split(",") if d.strip()]
        b = [d.strip() for d in m.group(2).split(",") if d.strip()]
        differing = [i for i in range(min(len(a), len(b))) if a[i] != b[i]]
        kind = "batch dimension" if len(a) == len(b) and differing == [0] else "shape"
    elif "dtype" in change:
        kind = "dtype"
    else:
        kind = "python value" if change else "unknown"
    return kind, _ADVICE[kind]


def _at_call(h: FunctionHistory, advice: str) -> str:
    """The advice, led by the script's line whose call traced (where the fix goes)."""
    if not h.call_site:
        return advice
    code = f" ({h.call_code})" if h.call_code else ""
    return f"traced by the call at {h.call_site}{code}: {advice[:1].lower()}{advice[1:]}"


def _call_evidence(h: FunctionHistory) -> dict[str, str]:
    return {"call_site": h.call_site, "call_code": h.call_code} if h.call_site else {}


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
        # the cause behind most re-traces decides the advice (the latest change breaks ties)
        latest_kind = classify_change(h.changes[-1] if h.changes else "")[0]
        ranked = sorted(h.causes.items(), key=lambda kv: (-kv[1], kv[0] != latest_kind))
        kind = ranked[0][0] if ranked else latest_kind
        advice = _ADVICE[kind]
        sizes = batch_sizes(h) if kind == "batch dimension" else []
        if len(sizes) > 2:
            advice = _VARYING_BATCH_ADVICE.format(n=len(sizes), sizes=", ".join(map(str, sizes)))
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
        changing = kind
        if len(ranked) > 1:  # mixed causes: each with its count, and each one's fix
            changing = ", ".join(f"{k} ({n})" for k, n in ranked)
            advice += "".join(f". Also {k}: {_ADVICE[k]}" for k, _ in ranked[1:])
        self._keep(f"{h.worker}|{h.name}", Finding(
            t=h.t, rule=self.id, severity=severity,
            message=(f"{what}: tf.function '{h.name}' traced {h.traces} times "
                     f"({h.instances} object{'s' if h.instances != 1 else ''}); "
                     f"changing: {changing}"),
            advice=_at_call(h, f"{advice}. Last change: {last_change}" if last_change else advice),
            evidence={
                **_call_evidence(h),
                "function": h.name,
                "traces": h.traces,
                "instances": h.instances,
                "excess_traces": excess,
                "change_kind": kind,
                "same_cause_retraces": same_cause,
                "last_change": last_change,
                **({"batch_sizes": ", ".join(map(str, sizes))} if len(sizes) > 2 else {}),
                "recent_changes": " | ".join(h.changes),
                "warning_threshold_excess": th.retrace_warning_excess,
            },
            first_step=h.excess_first_step, last_step=h.last_step, worker=h.worker,
        ))


    def current(self, tel: Telemetry, now: float) -> dict[str, Finding]:
        """The findings, with the host memory that grew with the traces as evidence (one cause,
        one finding: host-memory-growth leaves that growth out)."""
        out = {}
        for subject, f in self._found.items():
            w = tel.workers.get(f.worker or "")
            if w is not None and w.traced_growth_bytes >= _TRACED_GROWTH_SHOWN:
                f = replace(f, evidence={**f.evidence,
                                         "host_memory_grown_with_traces_mb": sig(w.traced_growth_bytes / MB, 2),
                                         "host_samples_with_traces": w.traced_growth_intervals})
            out[subject] = f
        return out


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
            advice=_at_call(h, f"Create '{h.name}' once, outside the training loop (at module level or in "
                               "__init__), and call the same object every step; do not wrap a function "
                               "in tf.function inside a loop or per batch"),
            evidence={
                **_call_evidence(h),
                "function": h.name,
                "instances": h.instances,
                "traces": h.traces,
                "warning_threshold_instances": th.recreated_warning_instances,
            },
            first_step=h.instances_first_step, last_step=h.last_step, worker=h.worker,
        ))

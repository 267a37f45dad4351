"""tf.function retraces: every real trace, what it was traced for, and what changed since the last.

``tracing_compilation._create_concrete_function`` runs exactly once per real trace (a cache
miss), with the function's name and the ``FunctionType`` it is traced for; TF's own
"triggered tf.function retracing" warning fires at most twice per function and is not used.
``Function.__init__`` is wrapped to count the tf.function objects created per name: a
tf.function re-created in a loop shows N objects each traced once, which no per-object counter
(``experimental_get_tracing_count``) can see.

Not reported (noise the user cannot act on): tf.data's functions (``map``/``filter`` bodies carry
the ``_tf_data_function`` attribute; the iterator helpers live in ``tensorflow/python/data``) and
TF's own internal helpers (any function whose Python code lives in the ``tensorflow`` package).
Reported, so that counts equal ``experimental_get_tracing_count()``: the second trace TF makes on a
function's first call when that call created variables (same inputs, a "no variable creation"
scope), with that as its change (``protocol.VARIABLES_MADE_CHANGE``; building the variables before the first
call saves it). Nested traces (Keras' ``one_step_on_data`` inside ``multi_step_on_iterator``) are
real and reported.

Evaluation functions are told apart from training ones: a trace that computes no gradient, in a
run that has trained before (Keras' test function under ``fit(validation_data=...)``, which has
the train function's name; a custom loop's test step), is reported with ``evaluation=True`` and
counted on its own, so Keras' test function is never "a second object" or a retrace of training.
The step probe says whether a trace trained (its ``training_marks`` grow while a gradient is
traced), so the Retrace is sent when the trace is done.

Everything here runs while TF traces (milliseconds), never on a step that does not trace; the
``Function.__init__`` wrapper costs a dict update.
"""

from __future__ import annotations

import collections
import os
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

from tpuwatch.agent.pipeline_map import library_roots, script_line
from tpuwatch.protocol import NEW_OBJECT_CHANGE, VARIABLES_MADE_CHANGE, Retrace

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.patches import Patches

PROBE = "retraces"

# Traces TF makes for itself through tracing_compilation with a hard-coded name.
_INTERNAL_NAMES = frozenset({"fn_with_cond", "initialize_variables", "cflow_gradient_wrapper"})
_TF_DATA_ATTRIBUTE = "_tf_data_function"
_MAX_SIGNATURE = 300
_MAX_CHANGE = 300
_MAX_TRACKED = 4096


@dataclass(frozen=True)
class Leaf:
    """One input of a trace, flattened: ``path`` like ``x`` or ``data[0]``."""

    path: str
    kind: str  # "tensor", "python", "other"
    text: str  # short form for the signature
    dtype: str = ""
    shape: tuple[int | None, ...] | None = None
    value: Any = None  # python values (Literal)
    key: str = ""  # full identity used to tell "changed" from "same"


def _tf_package_dir() -> str | None:
    # Not tensorflow.__path__[0]: TF puts Keras' API directories first on its __path__.
    import importlib

    init = getattr(importlib.import_module("tensorflow.python"), "__file__", None)
    return os.path.dirname(os.path.dirname(os.path.realpath(init))) + os.sep if init else None


def _code_file(fn: Any) -> str | None:
    """The file of the Python code behind ``fn``, through decorators (autograph, tf_decorator)."""
    for _ in range(32):
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is None or wrapped is fn:
            break
        fn = wrapped
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        call = getattr(type(fn), "__call__", None)  # noqa: B004 (not a callable() test: its code is wanted)
        code = getattr(call, "__code__", None)
    return code.co_filename if code is not None else None


def _shape(spec: Any) -> tuple[int | None, ...] | None:
    shape = getattr(spec, "shape", None)
    if shape is None:
        return None
    try:
        dims = shape.as_list() if shape.rank is not None else None
    except (AttributeError, ValueError):
        return None
    return None if dims is None else tuple(dims)


def _shape_text(shape: tuple[int | None, ...] | None) -> str:
    if shape is None:
        return "(unknown rank)"
    if len(shape) == 1:
        return f"({shape[0]},)"
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ")"


def _python_text(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _flatten(path: str, tc: Any, out: list[Leaf]) -> None:
    """Flattens a trace type into leaves. Unknown types become one opaque leaf."""
    from tensorflow.core.function.trace_type import default_types
    from tensorflow.python.framework import tensor as tensor_lib
    from tensorflow.python.framework import type_spec

    if isinstance(tc, tensor_lib.TensorSpec):
        dtype = getattr(tc.dtype, "name", str(tc.dtype))
        shape = _shape(tc)
        text = f"{dtype}{_shape_text(shape)}"
        out.append(Leaf(path, "tensor", text, dtype, shape, key=text))
    elif isinstance(tc, default_types.Literal):
        value = tc.value
        text = _python_text(value)
        out.append(Leaf(path, "python", text, value=value, key=f"{type(value).__name__}:{value!r}"))
    elif isinstance(tc, default_types.Tuple):
        for i, c in enumerate(tc.components):
            _flatten(f"{path}[{i}]", c, out)
    elif isinstance(tc, default_types.List):
        for i, c in enumerate(tc.components_tuple.components):
            _flatten(f"{path}[{i}]", c, out)
    elif isinstance(tc, default_types.NamedTuple):
        for name, c in zip(tc.attribute_names, tc.attributes.components):
            _flatten(f"{path}.{name}", c, out)
    elif isinstance(tc, default_types.Attrs):
        named = tc.named_attributes
        for name, c in zip(named.attribute_names, named.attributes.components):
            _flatten(f"{path}.{name}", c, out)
    elif isinstance(tc, default_types.Dict):
        for k in sorted(tc.mapping, key=repr):
            _flatten(f"{path}[{k!r}]", tc.mapping[k], out)
    elif type(tc).__name__ == "PerReplicaSpec":
        # One spec per replica, normally identical: show it once, "x4" for the replica count.
        specs = list(getattr(tc, "_value_specs", ()))
        inner: list[Leaf] = []
        for spec in specs[:1]:
            _flatten(path, spec, inner)
        same = all(repr(s) == repr(specs[0]) for s in specs[1:])
        if same and len(inner) == 1:
            leaf = inner[0]
            out.append(Leaf(leaf.path, leaf.kind, f"{leaf.text} x{len(specs)}", leaf.dtype, leaf.shape,
                            leaf.value, key=f"{leaf.key} x{len(specs)}"))
        else:
            for i, spec in enumerate(specs):
                _flatten(f"{path}<replica {i}>", spec, out)
    elif isinstance(tc, type_spec.TypeSpec):
        name = type(tc).__name__
        out.append(Leaf(path, "other", name.removesuffix("Spec") or name, key=repr(tc)))
    else:
        name = type(tc).__name__
        out.append(Leaf(path, "other", name, key=repr(tc)))


def describe(function_type: Any) -> list[Leaf]:
    """The inputs of a trace as leaves, in parameter order."""
    leaves: list[Leaf] = []
    for name, param in function_type.parameters.items():
        _flatten(name, param.type_constraint, leaves)
    return leaves


def signature_text(leaves: Iterable[Leaf]) -> str:
    text = ", ".join(f"{leaf.path}: {leaf.text}" for leaf in leaves)
    return text if len(text) <= _MAX_SIGNATURE else text[: _MAX_SIGNATURE - 3] + "..."


def change_text(before: list[Leaf], after: list[Leaf]) -> str:
    """What differs between two traces' inputs, most telling first; "" when nothing visible."""
    old = {leaf.path: leaf for leaf in before}
    new = {leaf.path: leaf for leaf in after}
    parts: list[str] = []
    for leaf in after:
        prev = old.get(leaf.path)
        if prev is None:
            parts.append(f"new argument {leaf.path}")
        elif prev.key != leaf.key:
            parts.append(_leaf_change(prev, leaf))
    for leaf in before:
        if leaf.path not in new:
            parts.append(f"argument {leaf.path} removed")
    text = "; ".join(parts)
    return text if len(text) <= _MAX_CHANGE else text[: _MAX_CHANGE - 3] + "..."


def _leaf_change(prev: Leaf, leaf: Leaf) -> str:
    if prev.kind == leaf.kind == "tensor":
        bits = []
        if prev.dtype != leaf.dtype:
            bits.append(f"dtype {prev.dtype} -> {leaf.dtype}")
        if prev.shape != leaf.shape:
            bits.append(f"shape {_shape_text(prev.shape)} -> {_shape_text(leaf.shape)}")
        if not bits:  # only the replica count changed
            bits.append(f"{prev.text} -> {leaf.text}")
        return f"{leaf.path}: " + ", ".join(bits)
    if prev.kind == leaf.kind == "python":
        prev_type, new_type = type(prev.value).__name__, type(leaf.value).__name__
        if prev_type == new_type:
            return f"{leaf.path}: python {new_type} {prev.text} -> {leaf.text}"
        return f"{leaf.path}: python {prev_type} {prev.text} -> {new_type} {leaf.text}"
    if prev.kind == "python" and leaf.kind == "tensor":
        return f"{leaf.path}: {_python_desc(prev)} -> tensor {leaf.text}"
    if prev.kind == "tensor" and leaf.kind == "python":
        return f"{leaf.path}: tensor {prev.text} -> {_python_desc(leaf)}"
    if prev.text == leaf.text:
        return f"{leaf.path}: {leaf.text} changed"
    return f"{leaf.path}: {prev.text} -> {leaf.text}"


def _python_desc(leaf: Leaf) -> str:
    if leaf.value is None:
        return "python None"
    return f"python {type(leaf.value).__name__} {leaf.text}"


class RetraceProbe:
    def __init__(self, agent: "Agent") -> None:
        self.agent = agent
        self._lock = threading.Lock()
        self._traces: collections.Counter[str] = collections.Counter()
        self._instances: collections.Counter[str] = collections.Counter()
        self._last: dict[str, tuple[list[Leaf], int]] = {}  # name -> (leaves, id of its cache)
        # Per tf.function (by id of its FunctionCache, which takes no weak references): scope
        # type and inputs of its last trace, to drop the variable-creation double trace. Bounded;
        # a reused id is harmless: a new function's first trace always overwrites the entry.
        self._last_by_cache: collections.OrderedDict[int, tuple[str, tuple[Any, ...]]] = collections.OrderedDict()
        self.functions: weakref.WeakSet[Any] = weakref.WeakSet()  # live user-visible tf.functions
        self._tf_dir = _tf_package_dir()
        self._inside_tf: dict[str, bool] = {}
        # id of a Function's cache -> its name, from creation until its first trace says whether it
        # is an evaluation function (then its object is counted under that kind); bounded
        self._created: collections.OrderedDict[int, str] = collections.OrderedDict()
        self._roots: tuple[str, ...] | None = None  # library directories: frames not the script's

    # --- filters --------------------------------------------------------------------------

    def is_internal(self, name: str, python_function: Any, attributes: Any) -> bool:
        if name in _INTERNAL_NAMES:
            return True
        if attributes and _TF_DATA_ATTRIBUTE in attributes:
            return True
        path = _code_file(python_function)
        if path is None or self._tf_dir is None:
            return False
        inside = self._inside_tf.get(path)
        if inside is None:  # realpath costs ~30 µs: once per file
            inside = self._inside_tf[path] = os.path.realpath(path).startswith(self._tf_dir)
        return inside

    # --- hooks ----------------------------------------------------------------------------

    def on_function_created(self, function: Any) -> None:
        name = getattr(function, "_name", None) or "?"
        if self.is_internal(name, getattr(function, "_python_function", None),
                            getattr(function, "_attributes", None)):
            return
        cache = getattr(function, "_function_cache", None)
        with self._lock:
            self._instances[name] += 1
            if cache is not None:
                self._created[id(cache)] = name
                if len(self._created) > _MAX_TRACKED:
                    self._created.popitem(last=False)
        self.functions.add(function)

    def training_marks(self) -> int:
        probe = self.agent.step_probe
        return getattr(probe, "training_marks", 0) if probe is not None else 0

    def on_trace(self, function_type: Any, tracing_options: Any, marks_before: int) -> None:
        """After a trace (``marks_before``: the step probe's training marks when it began)."""
        name = tracing_options.name
        if self.is_internal(name, tracing_options.python_function, tracing_options.attributes):
            return
        marks = self.training_marks()
        evaluation = marks == marks_before and marks > 0
        leaves = describe(function_type)
        key = tuple(leaf.key for leaf in leaves)
        scope = getattr(tracing_options.scope_type, "name", str(tracing_options.scope_type))
        cache = id(tracing_options.function_cache)
        if tracing_options.function_cache is not None:
            with self._lock:
                prev_here = self._last_by_cache.pop(cache, None)
                self._last_by_cache[cache] = (scope, key)
                if len(self._last_by_cache) > _MAX_TRACKED:
                    self._last_by_cache.popitem(last=False)
            variables_made = (prev_here is not None and prev_here[0] == "VARIABLE_CREATION"
                              and scope == "NO_VARIABLE_CREATION" and prev_here[1] == key)
        else:
            variables_made = False
        counted = f"{name}\0evaluation" if evaluation else name
        with self._lock:
            created = self._created.pop(cache, None)
            if created is not None and evaluation:  # its object was counted as a training one
                self._instances[created] -= 1
                self._instances[f"{created}\0evaluation"] += 1
            self._traces[counted] += 1
            traces = self._traces[counted]
            # A function traced without a Function object (rare) still counts as one.
            instances = max(self._instances[counted], 1)
            previous = self._last.get(counted)
            self._last[counted] = (leaves, cache)
        if variables_made:  # a real trace (TF counts it, and compiles again), with its own cause
            change = VARIABLES_MADE_CHANGE
        elif previous is None:
            change = ""
        else:
            change = change_text(previous[0], leaves)
            if not change:
                change = (NEW_OBJECT_CHANGE if previous[1] != cache
                          else "same inputs (captured values or context changed)")
        if self._roots is None:
            self._roots = library_roots()
        call_site, call_code = script_line(1, self._roots)  # the script's call that traced
        self.agent.emit(Retrace(
            t=self.agent.clock(),
            function=name,
            traces=traces,
            instances=instances,
            signature=signature_text(leaves),
            change=change,
            step=self.agent.global_step,
            evaluation=evaluation,
            call_site=call_site,
            call_code=call_code,
        ))


def install(agent: "Agent", patches: "Patches") -> RetraceProbe:
    """Hooks tracing and tf.function creation. Raises PatchError if TF's internals moved."""
    from tensorflow.python.eager.polymorphic_function import polymorphic_function, tracing_compilation

    probe = RetraceProbe(agent)

    def make_create(original: Callable[..., Any]) -> Callable[..., Any]:
        def _create_concrete_function(function_type: Any, type_context: Any, func_graph: Any,
                                      tracing_options: Any) -> Any:
            if not agent.enabled(PROBE):
                return original(function_type, type_context, func_graph, tracing_options)
            marks = probe.training_marks()
            try:
                return original(function_type, type_context, func_graph, tracing_options)
            finally:  # a trace that raised was still a trace
                try:
                    probe.on_trace(function_type, tracing_options, marks)
                except Exception as e:  # the probe's bug, never the script's trace: the probe is disabled
                    agent.probe_failed(PROBE, e)

        return _create_concrete_function

    def make_init(original: Callable[..., None]) -> Callable[..., None]:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            if agent.enabled(PROBE):
                try:
                    probe.on_function_created(self)
                except Exception as e:  # the script's tf.function exists already: only the probe stops
                    agent.probe_failed(PROBE, e)

        return __init__

    patches.wrap(tracing_compilation, "_create_concrete_function", make_create)
    patches.wrap(polymorphic_function.Function, "__init__", make_init)
    return probe

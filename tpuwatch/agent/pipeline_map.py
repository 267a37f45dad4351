"""The pipeline map: for every dataset the training iterates, its tf.data stages with their settings
and the line of the script that made each one.

``DatasetV2.__init__`` runs once per transformation, never per element (docs/architecture.md,
"What the code rests on"): the wrapper notes where the script made the stage (the first frame
outside TensorFlow, Keras and tpuwatch, and the TF API it called, like ``map``). When the
training makes an iterator (``iter(ds)``, ``for x in ds``, a distributed dataset's ``__iter__``,
Keras' fit doing either), the chain is walked once through ``_inputs()`` and sent as one
:class:`~tpuwatch.protocol.Pipeline`. Nothing changes in the pipeline: the settings are read
from the stages' private attributes (each read guarded: an attribute missing in this TF version
leaves that setting out), and the only op run is ``cardinality()`` of the stage under an
in-memory cache or a shuffle (to bound what it holds).
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable

from tpuwatch.protocol import Pipeline

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.patches import Patches

PROBE = "pipeline_map"
_SITE = "_tpuwatch_site"  # set on each dataset: (file:line, api, code, added_by)
_OWN = "_tpuwatch_own"  # on a distributed dataset's worker dataset: the script's dataset it was made from
_MAPPED = "_tpuwatch_mapped"
_MAX_STAGES = 64
_MAX_DATASETS = 64  # pipelines sent per run (a script that makes datasets in a loop stops here)
_MAX_CODE = 160
_TF_UTIL = f"{os.sep}tensorflow{os.sep}python{os.sep}util{os.sep}"
_AUTOTUNE = -1
_SITE_PACKAGES = f"{os.sep}site-packages{os.sep}"
_DIST_PACKAGES = f"{os.sep}dist-packages{os.sep}"
_LOOP_FETCHES = 3  # eager fetches in a row at one line of the script: its loop
_MAX_FETCH_LOOKS = 16
_TUNABLE = frozenset({"buffer_size", "num_parallel_calls", "cycle_length", "block_length",
                      "num_parallel_reads"})  # -1 is AUTOTUNE (for a repeat's count, forever)

# stage class -> (settings to read: (attribute, name shown))
_SETTINGS: dict[str, tuple[tuple[str, str], ...]] = {
    "_PrefetchDataset": (("_buffer_size", "buffer_size"),),
    "_BatchDataset": (("_batch_size", "batch_size"), ("_drop_remainder", "drop_remainder")),
    "_ParallelBatchDataset": (("_batch_size", "batch_size"), ("_drop_remainder", "drop_remainder"),
                              ("_num_parallel_calls", "num_parallel_calls")),
    "_PaddedBatchDataset": (("_batch_size", "batch_size"), ("_drop_remainder", "drop_remainder")),
    "_ShuffleDataset": (("_buffer_size", "buffer_size"),),
    "CacheDataset": (("_filename", "filename"),),
    "_MapDataset": (),
    "_ParallelMapDataset": (("_num_parallel_calls", "num_parallel_calls"), ("_deterministic", "deterministic")),
    "_InterleaveDataset": (("_cycle_length", "cycle_length"), ("_block_length", "block_length")),
    "_ParallelInterleaveDataset": (("_cycle_length", "cycle_length"), ("_block_length", "block_length"),
                                   ("_num_parallel_calls", "num_parallel_calls"),
                                   ("_deterministic", "deterministic")),
    "TFRecordDatasetV2": (("_num_parallel_reads", "num_parallel_reads"),),
    "_RepeatDataset": (("_count", "count"),),
    "_TakeDataset": (("_count", "count"),),
}


def library_roots() -> tuple[str, ...]:
    """Directories whose frames are not the script's: TensorFlow, Keras, tpuwatch, the stdlib."""
    roots = {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    for name in ("tensorflow", "keras", "tf_keras", "tensorflow_datasets"):
        mod = sys.modules.get(name)
        path = getattr(mod, "__file__", None)
        if path:
            roots.add(os.path.dirname(os.path.abspath(path)))
    roots.add(os.path.dirname(os.__file__))
    return tuple(r + os.sep for r in roots)


def is_script_path(path: str, roots: tuple[str, ...]) -> bool:
    """A frame of the script's (or of a module of the user's): not under a library root, not
    generated code (``<string>``, autograph's conversions)."""
    return not path.startswith(roots) and not path.startswith("<") and "__autograph_generated" not in path


def script_line(skip: int, roots: tuple[str, ...] | None = None) -> tuple[str, str]:
    """(``file:line``, source line) of the innermost frame of the script's above the caller's
    ``skip`` frames, or ("", "") when there is none (a walk of the stack: for rare events)."""
    roots = roots if roots is not None else library_roots()
    f: Any = sys._getframe(skip + 1)
    while f is not None and not is_script_path(f.f_code.co_filename, roots):
        f = f.f_back
    if f is None:
        return "", ""
    path, line = f.f_code.co_filename, f.f_lineno
    return f"{os.path.basename(path)}:{line}", linecache.getline(path, line).strip()[:_MAX_CODE]


def _owner(path: str) -> str:
    if f"{os.sep}keras{os.sep}" in path or f"{os.sep}tf_keras{os.sep}" in path:
        return "keras"
    if f"{os.sep}distribute{os.sep}" in path:
        return "tf.distribute"
    return "tensorflow"


class PipelineMap:
    def __init__(self, agent: "Agent") -> None:
        self.agent = agent
        self._roots: tuple[str, ...] | None = None
        self._sent = 0
        self.held_bytes = 0  # what the mapped pipelines' caches and shuffle buffers can hold
        self._local = threading.local()  # .quiet: inside a distributed dataset's __iter__
        self._maps: dict[int, Pipeline] = {}  # what was sent, by dataset number
        # dataset -> [last eager fetch's line, fetches in a row there, frame walks (the cap once said)]
        self._fetches: dict[int, list[Any]] = {}

    # --- creation sites (once per transformation) ------------------------------------------

    def _skip_roots(self) -> tuple[str, ...]:
        """Directories whose frames are not the script's (computed once)."""
        if self._roots is None:
            self._roots = library_roots()
        return self._roots

    def site(self, skip: int) -> tuple[str, str, str, str]:
        """(``file:line``, TF API called, source line, added_by) of the calling script frame."""
        roots = self._skip_roots()
        f: Any = sys._getframe(skip)
        api = ""
        first_lib = ""
        while f is not None:
            path = f.f_code.co_filename
            if is_script_path(path, roots):
                break
            if (not first_lib and not path.endswith(("dataset_ops.py", "_op.py", "readers.py"))
                    and _TF_UTIL not in path):  # decorators (deprecation, dispatch) are tf.data's
                first_lib = path  # the first frame above tf.data's own constructors
            if not path.startswith("<") and _TF_UTIL not in path:
                api = f.f_code.co_name
            f = f.f_back
        if f is None:
            return "", api, "", "tensorflow"
        path, line = f.f_code.co_filename, f.f_lineno
        added_by = _owner(first_lib) if first_lib else ""
        code = linecache.getline(path, line).strip()[:_MAX_CODE]
        return f"{os.path.basename(path)}:{line}", api, code, added_by

    def make_init(self, original: Callable[..., None]) -> Callable[..., None]:
        this = self

        def __init__(ds: Any, *args: Any, **kwargs: Any) -> None:
            original(ds, *args, **kwargs)
            if this.agent.enabled(PROBE):
                try:
                    ds.__dict__[_SITE] = this.site(2)
                except Exception as e:  # after the script's dataset was made: only the probe stops
                    this.agent.probe_failed(PROBE, e)

        return __init__

    # --- iteration (once per dataset) -------------------------------------------------------

    def make_iter(self, original: Callable[..., Any], consumer: str,
                  dataset_of: Callable[[Any], Any]) -> Callable[..., Any]:
        this = self

        def __iter__(dds: Any, *args: Any, **kwargs: Any) -> Any:
            this._local.quiet = getattr(this._local, "quiet", 0) + 1
            try:
                it = original(dds, *args, **kwargs)
            finally:
                this._local.quiet -= 1
            if this.agent.enabled(PROBE):
                try:
                    from tensorflow.python.eager import context
                    from tensorflow.python.framework import ops

                    ds = dataset_of(dds)
                    if ds is not None:
                        # iterated inside a tf.function: read outside its graph (cardinality
                        # would otherwise add ops to the user's function)
                        with ops.init_scope():
                            this.record(ds, consumer)
                        if context.executing_eagerly():
                            this.stamp(it, ds)
                except Exception as e:  # the script's iterator is made: only the probe stops
                    this.agent.probe_failed(PROBE, e)
            return it

        return __iter__

    def make_iterator_init(self, original: Callable[..., None]) -> Callable[..., None]:
        this = self

        def __init__(it: Any, dataset: Any = None, *args: Any, **kwargs: Any) -> None:
            original(it, dataset, *args, **kwargs)
            if dataset is not None and not getattr(this._local, "quiet", 0) and this.agent.enabled(PROBE):
                try:
                    from tensorflow.python.eager import context

                    if context.executing_eagerly():
                        this.record(dataset, "iterator")
                        this.stamp(it, dataset)
                except Exception as e:  # the script's iterator is made: only the probe stops
                    this.agent.probe_failed(PROBE, e)

        return __init__

    def record(self, ds: Any, consumer: str) -> None:
        if ds.__dict__.get(_MAPPED) or self._sent >= _MAX_DATASETS:
            return
        self._sent += 1
        ds.__dict__[_MAPPED] = self._sent
        msg = dataclasses.replace(self.describe(ds, consumer, self._sent), use=keras_use(sys._getframe(1)))
        self._maps[self._sent] = msg
        self.held_bytes += sum(b for b in msg.holds_bytes if b > 0)
        self.agent.emit(msg)

    # --- where batches are fetched eagerly (once per dataset) ------------------------------

    @staticmethod
    def stamp(it: Any, ds: Any) -> None:
        """Marks an iterator made eagerly with its dataset's number (read by :meth:`fetched`)."""
        number = ds.__dict__.get(_MAPPED)
        if number:
            it.__dict__[_MAPPED] = number

    def fetched(self, it: Any) -> None:
        """A batch of ``it`` was fetched eagerly (the input-wait probe's eager path: the training
        thread, every such fetch; a dict read once the dataset's site is known). Once the script
        has fetched ``_LOOP_FETCHES`` batches in a row at the same line (``for batch in
        dataset``, ``next(iterator)`` in a Python loop; not a one-off ``next(iter(ds))`` look at
        a batch), the pipeline is said again with that line: where each batch is fetched
        between steps. Keras' own eager fetches (a fit building its model, ``run_eagerly``) are
        not the script's. At most ``_MAX_FETCH_LOOKS`` frame walks per dataset."""
        number = getattr(it, "__dict__", {}).get(_MAPPED)
        if not number:
            return
        seen = self._fetches.setdefault(number, ["", 0, 0])  # [last fetch's line, in a row there, looks]
        if seen[2] >= _MAX_FETCH_LOOKS or not self.agent.enabled(PROBE):
            return
        here = self._fetch_line()
        seen[1] = seen[1] + 1 if here and here == seen[0] else int(bool(here))
        seen[0] = here
        seen[2] += 1
        msg = self._maps.get(number)
        if seen[1] >= _LOOP_FETCHES and msg is not None:
            seen[2] = _MAX_FETCH_LOOKS  # said: no more looks
            self.agent.emit(dataclasses.replace(msg, t=self.agent.clock(), consumer_site=here))

    def _fetch_line(self) -> str:
        """The script's ``file:line`` that fetched ("" when Keras did, or none is found)."""
        roots = self._skip_roots()
        f: Any = sys._getframe(2)
        while f is not None:
            path = f.f_code.co_filename
            if f"{os.sep}keras{os.sep}" in path or f"{os.sep}tf_keras{os.sep}" in path:
                return ""
            if (not path.startswith(roots) and not path.startswith("<") and "__autograph_generated" not in path
                    and _SITE_PACKAGES not in path and _DIST_PACKAGES not in path):
                return f"{os.path.basename(path)}:{f.f_lineno}"
            f = f.f_back
        return ""

    def describe(self, ds: Any, consumer: str, number: int) -> Pipeline:
        chain: list[Any] = []
        node = ds
        while node is not None and len(chain) < _MAX_STAGES:
            chain.append(node)
            node = _first_input(node)
        chain.reverse()  # source first
        tf_prefetch, parallelizes = _rewrites(ds)
        stages, sites, settings, code, holds, added, parallel = [], [], [], [], [], [], []
        for node in chain:
            site, api, line, by = node.__dict__.get(_SITE) or ("", "", "", "tensorflow")
            cls = type(node).__name__
            # a stage Keras or tf.distribute made is named by its class: its API call is theirs;
            # so is one the script made by calling a class (TFRecordDataset(files) is __init__)
            stages.append(api if api and api != "__init__" and not by else _stage_name(cls))
            sites.append(site)
            settings.append(_settings(node, cls))
            code.append(line)
            holds.append(_holds(node, cls))
            added.append(by)
            parallel.append(bool(parallelizes) and cls == "_MapDataset" and _stateless(node) is True)
        return Pipeline(t=self.agent.clock(), dataset=number, consumer=consumer, stages=tuple(stages),
                        sites=tuple(sites), settings=tuple(settings), code=tuple(code),
                        holds_bytes=tuple(holds), added_by=tuple(added),
                        elements=_cardinality(ds.__dict__.get(_OWN, ds)),
                        tf_prefetch=tf_prefetch, tf_parallel=tuple(parallel))


#: Keras' methods that iterate a dataset, by the name of their frame in Keras' trainer
_KERAS_METHODS = frozenset({"fit", "evaluate", "predict"})


def keras_use(frame: Any) -> str:
    """What Keras iterates a dataset for, from the frames above ``frame``: "predict", "validation"
    (``evaluate`` inside ``fit``), "test" (``evaluate``), "train" (``fit``); "" outside Keras."""
    seen: set[str] = set()
    while frame is not None:
        name = frame.f_code.co_name
        if name in _KERAS_METHODS and f"{os.sep}keras{os.sep}" in frame.f_code.co_filename:
            seen.add(name)
        frame = frame.f_back
    if "predict" in seen:
        return "predict"
    if "evaluate" in seen:
        return "validation" if "fit" in seen else "test"
    return "train" if "fit" in seen else ""


def _rewrites(ds: Any) -> tuple[bool | None, bool | None]:
    """What two of TensorFlow's default graph rewrites will do to the pipeline iterated as
    ``ds``, from its options (None: the options cannot be read): (``inject_prefetch``: it adds
    ``prefetch(AUTOTUNE)`` after a synchronous last stage; ``map_parallelization``: it runs
    a ``map`` with a stateless function in parallel, ``num_parallel_calls=AUTOTUNE``). Both are
    on unless the options turn off autotune, the rewrite, or the default optimizations (TF 2.16
    and 2.21: a sequential 4 ms map before a 10 ms step waits 0.2 ms a batch as written, 4.5 ms
    with the prefetch rewrite off; a stateless map runs as ``ParallelMap``)."""
    try:
        options = ds.options()
        optimization = options.experimental_optimization
        defaults = optimization.apply_default_optimizations is not False
        on = options.autotune.enabled is not False
        return (on and (optimization.inject_prefetch is True or (defaults and optimization.inject_prefetch is None)),
                on and (optimization.map_parallelization is True
                        or (defaults and optimization.map_parallelization is None)))
    except Exception:  # an options object without these fields: not known
        return None, None


def _stateless(ds: Any) -> bool | None:
    """The function of a ``map`` is stateless as TensorFlow's ``map_parallelization`` judges it
    (its ``IsFunctionStateful`` with asserts skipped): no stateful op but ``Assert``, looking into
    the branches of an ``If`` and the body of a ``While`` (a ``tf.debugging.assert_*`` compiles to
    an ``If`` around its ``Assert``). ``tf.numpy_function``, ``tf.py_function``, ``tf.print``,
    variable reads and ``tf.random`` ops (seeded or not; ``stateless_*`` are not) are stateful.
    None: not known (a legacy function, another TF's layout)."""
    try:
        function = ds.__dict__["_map_func"].function
        fdef = function.function_def
        if not fdef.signature.is_stateful:
            return True
        library = {f.signature.name: f for f in function.graph.as_graph_def().library.function}
        return not _stateful(fdef, library, 0)
    except Exception:  # not known
        return None


_CALLS = {"If": ("then_branch", "else_branch"), "While": ("cond", "body")}


def _stateful(fdef: Any, library: dict[str, Any], depth: int) -> bool:
    from tensorflow.python.framework import op_def_registry

    if not fdef.signature.is_stateful:
        return False
    if depth > 16:
        return True
    for node in fdef.node_def:
        op = op_def_registry.get(node.op)
        if op is None:
            return True  # a call of a function by its name: TF counts it stateful too
        if not op.is_stateful or node.op == "Assert":
            continue
        called = [library.get(node.attr[a].func.name) for a in _CALLS.get(node.op, ())]
        if called and all(f is not None and not _stateful(f, library, depth + 1) for f in called):
            continue
        return True
    return False


def _first_input(ds: Any) -> Any:
    impl = ds.__dict__.get("_impl")  # TFRecordDatasetV2 wraps its real chain
    if impl is not None and type(ds).__name__ == "TFRecordDatasetV2":
        ds = impl
    try:
        inputs = ds._inputs()
    except Exception:  # a dataset class without _inputs(): the chain ends here (stated as such)
        return None
    return inputs[0] if inputs else None


def _stage_name(cls: str) -> str:
    return cls.strip("_").removesuffix("V2").removesuffix("Dataset").lower() or cls


def _plain(value: Any, tunable: bool = False) -> str:
    if hasattr(value, "numpy"):
        value = value.numpy()
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if tunable and isinstance(value, int) and not isinstance(value, bool) and value == _AUTOTUNE:
        return "AUTOTUNE"
    return repr(value) if isinstance(value, str) else str(value)


def _settings(ds: Any, cls: str) -> str:
    parts = []
    for attr, name in _SETTINGS.get(cls, ()):
        if attr not in ds.__dict__:
            continue
        try:
            parts.append(f"{name}={_plain(ds.__dict__[attr], name in _TUNABLE)}")
        except Exception:  # a setting that cannot be read as a plain value is left out
            continue
    return ", ".join(parts)


def _element_bytes(ds: Any) -> int | None:
    import tensorflow as tf

    total = 0
    for spec in tf.nest.flatten(ds.element_spec):
        shape = getattr(spec, "shape", None)
        dtype = getattr(spec, "dtype", None)
        if shape is None or dtype is None or not shape.is_fully_defined() or dtype == tf.string:
            return None
        total += shape.num_elements() * dtype.size
    return total


def _cardinality(ds: Any) -> int | None:
    try:
        n = int(ds.cardinality())
    except Exception:  # unknown size: reported as None
        return None
    return n if n >= 0 else None


def _holds(ds: Any, cls: str) -> int:
    """Bytes the stage keeps in host memory: 0 none, -1 unknown."""
    try:
        if cls == "CacheDataset":
            if _plain(ds.__dict__.get("_filename", "")) not in ("''", ""):
                return 0  # a file cache holds its data on disk
            inp = _first_input(ds)
            n = _cardinality(inp) if inp is not None else None
            size = _element_bytes(inp) if inp is not None else None
            return n * size if n is not None and size is not None else -1
        if cls == "_ShuffleDataset":
            buf = int(_plain(ds.__dict__["_buffer_size"]))
            inp = _first_input(ds)
            n = _cardinality(inp) if inp is not None else None
            size = _element_bytes(inp) if inp is not None else None
            if size is None:
                return -1
            return (min(buf, n) if n is not None else buf) * size
    except Exception:  # the bound is unknown, not an error of the probe
        return -1
    return 0


def _distributed(dds: Any) -> Any:
    """The dataset a distributed dataset's first input worker iterates: the script's, with the
    stages tf.distribute added (rebatch, auto-shard) when they still lead back to it; else the
    script's own (a clone made from its graph has lost the chain)."""
    original = dds.__dict__.get("_original_dataset")
    cloned = (dds.__dict__.get("_cloned_datasets") or [None])[0]
    node, hops = cloned, 0
    while node is not None and hops < _MAX_STAGES:
        if node is original:
            cloned.__dict__[_OWN] = original  # its size per pass is the script's dataset's
            return cloned
        node, hops = _first_input(node), hops + 1
    return original


def install(agent: "Agent", patches: "Patches") -> PipelineMap:
    from tensorflow.python.data.ops import dataset_ops, iterator_ops
    from tensorflow.python.distribute import input_lib

    pm = PipelineMap(agent)
    patches.wrap(dataset_ops.DatasetV2, "__init__", pm.make_init)
    patches.wrap(iterator_ops.OwnedIterator, "__init__", pm.make_iterator_init)
    patches.wrap(input_lib.DistributedDataset, "__iter__",
                 lambda o: pm.make_iter(o, "experimental_distribute_dataset", _distributed))
    patches.wrap(input_lib.DistributedDatasetsFromFunction, "__iter__",
                 lambda o: pm.make_iter(o, "distribute_datasets_from_function",
                                        lambda d: (d.__dict__.get("_datasets") or [None])[0]))
    return pm

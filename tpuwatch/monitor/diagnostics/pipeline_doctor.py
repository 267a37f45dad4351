"""Which stage of the input pipeline starves the step, and the one edit that fixes it.

Read from the pipeline map (:class:`~tpuwatch.protocol.Pipeline`: each stage, its settings and
the script's line that made it). The culprit is the first of these the pipeline has, in the
order they cost a step: a Python generator source, a ``map`` that runs one element at a time
(its function stateful: TensorFlow's ``map_parallelization`` runs a stateless one in parallel),
an ``interleave`` reading one input at a time, files read one at a time, and no ``prefetch`` at
the end where the dataset's options turn off the one TensorFlow adds (its ``inject_prefetch``
rewrite puts ``prefetch(AUTOTUNE)`` after a synchronous last stage by default). A pipeline that has
none of them is not told to add what it has: the wait is then the fetch itself (a custom loop's
Python ``for`` over the dataset or a distributed dataset, fetching each batch eagerly) or Keras
slicing NumPy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuwatch.protocol import InputStages, Pipeline

AUTOTUNE = "tf.data.AUTOTUNE"
_PASS_THROUGH = frozenset({"with_options", "options", "repeat", "take", "skip"})
#: Step functions Keras' fit runs (the fetch is inside them).
KERAS_STEP_FUNCTIONS = frozenset({"multi_step_on_iterator", "one_step_on_iterator", "train_function",
                                  "one_step_on_data"})


@dataclass(frozen=True)
class Culprit:
    stage: str  # "map", "prefetch" (missing), "from_generator", ... ; "" when no stage is at fault
    site: str  # "train.py:41" ("" unknown)
    problem: str  # what is wrong, in words
    fix: str  # the one edit, in words
    old_code: str = ""  # the line as written (stripped), when the edit is a text change of it
    new_code: str = ""
    #: the pipeline overlaps with the step already: the wait is the fetch or Keras' own input
    #: (a stage measured in a profile does not replace this verdict)
    overlapped: bool = False


def training_pipeline(pipelines: list[Pipeline]) -> Pipeline | None:
    """The pipeline the training iterates first (Keras' validation data comes after)."""
    return pipelines[0] if pipelines else None


def culprit(p: Pipeline, fetch_in_step: bool) -> Culprit:
    """The stage to change in ``p``. ``fetch_in_step``: the step function fetches its batch
    itself (Keras' fit, ``next(iterator)`` inside a tf.function), so no eager fetch is timed."""
    user = _user_stages(p)
    if not user:
        site = p.sites[0] if p.stages else ""
        if p.stages and p.stages[-1] == "prefetch":
            # Keras 3 slices the arrays by batch in parallel and prefetches: a tf.data.Dataset of
            # the script's would overlap no more (measured: input_numpy_fit.py, 7% -> 6%)
            return Culprit("", site, f"fit takes NumPy arrays at {site or 'the fit call'}: Keras already "
                           "slices, batches and prefetches them in a tf.data pipeline of its own, so no "
                           "edit of the input overlaps more", "the host's CPU feeds it: the wait grows "
                           "when other processes share the cores with tf.data and the step", overlapped=True)
        return Culprit("", site, "fit takes NumPy arrays: Keras slices and batches them on the host "
                       "between steps, with no tf.data pipeline of yours to overlap it",
                       f"at {site or 'the fit call'}, pass a tf.data.Dataset instead: "
                       f"tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x)).batch(batch_size)"
                       f".prefetch({AUTOTUNE})", overlapped=True)
    cached = max((i for i, s in enumerate(user) if s[0] == "cache"), default=-1)
    rules = [(rule[0], i, rule[1]) for i in range(len(user)) if (rule := _stage_rule(user, i, cached))]
    if rules:
        return min(rules, key=lambda r: (r[0], r[1]))[2]  # the first of the kind that costs most
    # stages that pass elements through as they come do not undo a prefetch before them
    working = [st for st in user if st[0] not in _PASS_THROUGH] or user[-1:]
    last = working[-1]
    # TensorFlow adds prefetch(AUTOTUNE) after a synchronous last stage, unless the dataset's
    # options turn that off (and tf.distribute adds one of its own after a distributed
    # dataset): only then is "add .prefetch" an edit that does anything
    if not _ahead(p, working) and p.tf_prefetch is False:
        stage, site, _, code, _ = last
        call = f".{stage}("
        new = _after_call(code, call, f".prefetch({AUTOTUNE})")
        return Culprit("prefetch", site, f"the pipeline does not end with .prefetch (its last stage "
                       f"is .{stage} at {site}) and its options turn off the one TensorFlow adds "
                       "(autotune, inject_prefetch or the default optimizations): the next batch is "
                       "made only when the step asks",
                       f"end it with .prefetch({AUTOTUNE}) after .{stage} at {site}",
                       code if new else "", new)
    if not fetch_in_step and p.consumer_site:  # the script fetches its batches in Python
        what = "distributed batch" if p.consumer != "iterator" else "batch"
        ahead = ("" if _ahead(p, working) or p.tf_prefetch is not True
                 else f" (TensorFlow prefetches after its last stage, .{last[0]})")
        return Culprit("", p.consumer_site, f"the pipeline overlaps with the step already{ahead}; the "
                       f"wait is the eager fetch of each {what} between steps, in Python at "
                       f"{p.consumer_site}", "fetch inside the step: pass the iterator to the tf.function "
                       "and call next(iterator) there (or run several steps per call)", overlapped=True)
    return Culprit("", "", "no setting of the pipeline explains the wait (no sequential map or serial "
                   "read, and its last stage is prefetched or runs ahead): its stages cannot "
                   "produce batches as fast as the step takes them",
                   ".cache() after the expensive stages if the data fits, or give tf.data "
                   "more host CPU (the tf.data service)")


def _settings(p: Pipeline) -> list[str]:
    """Each stage's settings as TensorFlow runs it: a ``map`` its ``map_parallelization`` rewrite
    runs in parallel (``Pipeline.tf_parallel``) has ``num_parallel_calls=AUTOTUNE``, so no rule
    asks for what TF does already (measured: a stateless map runs as ``ParallelMap``)."""
    parallel = p.tf_parallel if len(p.tf_parallel) == len(p.stages) else (False,) * len(p.stages)
    return [f"{st}{', ' if st else ''}num_parallel_calls=AUTOTUNE" if par and "num_parallel_calls" not in st else st
            for st, par in zip(p.settings, parallel)]


def pipeline_notes(p: Pipeline) -> list[str]:
    """What the script's stages do not show (the pipeline map's last lines, in the report and the
    Input panel): a map TensorFlow runs in parallel, the prefetch it adds after a synchronous
    last stage (or that the options turn it off), and where each batch is fetched eagerly."""
    notes = [f"TensorFlow runs .map at {site or '?'} in parallel (its function is stateless)"
             for (stage, site, written, par, by) in zip(p.stages, p.sites, p.settings, p.tf_parallel, p.added_by)
             if par and not by and "num_parallel_calls" not in written]
    working = [st for st in _user_stages(p) if st[0] not in _PASS_THROUGH]
    if working and not _ahead(p, working):
        last = working[-1][0]
        if p.tf_prefetch is False:
            notes.append(f"no .prefetch: the dataset's options turn off the one TensorFlow adds after .{last}")
        elif p.tf_prefetch is True:
            notes.append(f"TensorFlow adds .prefetch(AUTOTUNE) after .{last}")
    if p.consumer_site:
        notes.append(f"each batch fetched eagerly, between steps, at {p.consumer_site}")
    return notes


def _user_stages(p: Pipeline) -> list[_Stage]:
    """The script's own stages (not Keras' or tf.distribute's), with their settings as TF runs them."""
    return [st for st in zip(p.stages, p.sites, _settings(p), p.code, p.added_by) if not st[4]]


def _ahead(p: Pipeline, working: list[_Stage]) -> bool:
    """A batch is made ahead of the step whatever the options: the script's last working stage is
    a ``prefetch`` or runs ahead by itself, or a library's ``prefetch`` follows it (tf.distribute
    ends a distributed dataset with ``.rebatch(...).prefetch(replicas)``)."""
    if working[-1][0] == "prefetch" or _runs_ahead(working):
        return True
    last_user = max((i for i, by in enumerate(p.added_by) if not by), default=-1)
    return any(st == "prefetch" for st in p.stages[last_user + 1:])


_Stage = tuple[str, str, str, str, str]  # stage, site, settings, code, added_by


def _stage_rule(user: list[_Stage], i: int, cached: int) -> tuple[int, Culprit] | None:
    """The edit stage ``i`` of the script's stages needs by its settings, with its rank (a
    generator before a sequential map before serial reads), or None. ``cached``: the index of
    the last ``cache`` stage (a map before it runs once)."""
    stage, site, settings, code, _ = user[i]
    if stage == "from_generator":
        if any(st[0] in ("map", "parallelmap") and "num_parallel_calls" in st[2] for st in user[i + 1:]):
            # the work is in a parallel map already: what waits is the generator's own yield
            return 0, Culprit(stage, site, f"the Python generator read by from_generator at {site} "
                              "still hands over one element at a time, holding the GIL (its work is "
                              "in a parallel .map already)", "read the data without a Python "
                              "generator: tf.data.Dataset.from_tensor_slices over the arrays or the "
                              "file names (then the parallel .map), or TFRecordDataset for records")
        return 0, Culprit(stage, site, f"the Python generator read by from_generator at {site} "
                          "makes one element at a time, holding the GIL",
                          "yield the raw element from the generator and move the per-element work "
                          f"(decode, augment, normalise) into .map(..., num_parallel_calls={AUTOTUNE}) "
                          "written in TF ops (tf.image, tf.cast: they run in parallel without the GIL; "
                          "the same NumPy code in tf.numpy_function keeps the GIL and gains little), or "
                          "read the data with from_tensor_slices / TFRecordDataset")
    if stage == "map" and "num_parallel_calls" not in settings and i > cached:
        return 1, _add_argument(stage, site, code, "num_parallel_calls", AUTOTUNE,
                                f".map at {site} runs one element at a time")
    if stage == "interleave":
        if "cycle_length=1," in settings + ",":
            new = code.replace("cycle_length=1", f"cycle_length={AUTOTUNE}, num_parallel_calls={AUTOTUNE}")
            return 2, Culprit(stage, site, f".interleave at {site} has cycle_length=1: it reads one "
                              "input at a time", "let it read several in parallel: "
                              f"cycle_length={AUTOTUNE}, num_parallel_calls={AUTOTUNE}",
                              code if new != code else "", new if new != code else "")
        if "num_parallel_calls" not in settings:
            return 2, _add_argument(stage, site, code, "num_parallel_calls", AUTOTUNE,
                                    f".interleave at {site} reads its inputs one after another")
    if stage == "tfrecord" and "num_parallel_reads=None" in settings:
        return 2, _add_argument(stage, site, code, "num_parallel_reads", AUTOTUNE,
                                f"TFRecordDataset at {site} reads its files one at a time",
                                call="TFRecordDataset(")
    return None


def _runs_ahead(working: list[tuple[str, str, str, str, str]]) -> bool:
    """The pipeline's last stage runs ahead of the step by itself, so a final ``prefetch`` adds
    nothing: a parallel ``map``/``interleave``/``batch`` last, or a ``batch`` right after one (a
    parallel ``map`` and its ``batch`` are fused into one parallel map-and-batch). Each keeps a
    buffer of finished elements that autotuning sizes (TF's ``inject_prefetch`` adds no prefetch
    after such a stage: it runs ahead already). Measured
    (``bench/prefetch_after_parallel_map.py``: ``map(read, AUTOTUNE).batch(8)``, 2 ms reads, 8 ms
    steps, load 1.5-3.4): 9-17 % of the loop waiting as written, 10-17 % with the prefetch, 9-17 %
    with ``inject_prefetch`` off, each round's three within 2 points; a ``batch`` after a parallel
    ``interleave`` of 4 readers (``--interleave``) 8.5-9 % without a prefetch, 8.5-10 % with it."""
    def parallel(st: tuple[str, str, str, str, str]) -> bool:
        return st[0].startswith("parallel") or "num_parallel_calls" in st[2]
    if parallel(working[-1]):
        return True
    return working[-1][0] in ("batch", "padded_batch") and len(working) > 1 and parallel(working[-2])


def _add_argument(stage: str, site: str, code: str, name: str, value: str, problem: str,
                  call: str = "") -> Culprit:
    new = _before_close(code, call or f".{stage}(", f", {name}={value}")
    return Culprit(stage, site, problem, f"add {name}={value}", code if new else "", new)


def _close_of(code: str, call: str) -> int:
    """Index of the parenthesis closing ``call`` (which ends with ``(``) in ``code``; -1."""
    start = code.find(call)
    if start < 0:
        return -1
    depth = 0
    for i in range(start + len(call) - 1, len(code)):
        c = code[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _before_close(code: str, call: str, text: str) -> str:
    i = _close_of(code, call)
    if i < 0:
        return ""
    inside = code[code.find(call) + len(call):i].strip()
    return code[:i] + (text if inside else text.lstrip(", ")) + code[i:]


def _after_call(code: str, call: str, text: str) -> str:
    i = _close_of(code, call)
    return code[:i + 1] + text + code[i + 1:] if i >= 0 else ""


# --- the stage measured in a profile (protocol.InputStages) ---------------------------------------

#: tf.data's iterator names (after its rewrites, version suffix removed) -> the pipeline map's
#: stages it can be, the one whose work it is first. A stage the script made by calling a class is
#: named by the class (``tensorslice``, ``tfrecord``: TFRecordDataset(files) reads through a
#: ``FlatMap`` over the file names, a ``ParallelInterleave`` with num_parallel_reads).
_ITERATOR_STAGES: dict[str, tuple[str, ...]] = {
    "TensorSlice": ("from_tensor_slices", "tensorslice"), "FromTensor": ("from_tensors",),
    "Tensor": ("from_tensors",), "Range": ("range",), "Generator": ("from_generator",),
    "FlatMap": ("flat_map", "from_generator", "tfrecord", "textline", "fixedlengthrecord"),
    "Map": ("map", "from_generator"), "ParallelMap": ("map",), "MapAndBatch": ("map", "batch"),
    "Batch": ("batch",), "ParallelBatch": ("batch",), "PaddedBatch": ("padded_batch",),
    "Shuffle": ("shuffle",), "ShuffleAndRepeat": ("shuffle", "repeat"), "Repeat": ("repeat",),
    "ForeverRepeat": ("repeat",), "Prefetch": ("prefetch",), "Interleave": ("interleave",),
    "ParallelInterleave": ("interleave", "tfrecord", "textline", "fixedlengthrecord"),
    "LegacyParallelInterleave": ("interleave",), "TFRecord": ("tfrecord",), "TextLine": ("textline",),
    "FixedLengthRecord": ("fixedlengthrecord",), "MemoryCache": ("cache",), "Cache": ("cache",),
    "FileCache": ("cache",), "Take": ("take",), "FiniteTake": ("take",), "Skip": ("skip",),
    "Filter": ("filter",), "ParallelFilter": ("filter",), "Zip": ("zip",), "Concatenate": ("concatenate",),
    "Unbatch": ("unbatch",), "Rebatch": ("rebatch",), "AutoShard": ("autoshard",),
}
#: One iterator running two stages of the script's, fused by tf.data's rewrites: the two stages,
#: root first (a map and the batch after it).
_FUSED = {"MapAndBatch": ("batch", "map"), "ShuffleAndRepeat": ("repeat", "shuffle")}
#: Iterators whose input runs on threads of their own: the consumer's self time is the wait for them.
_ASYNC = frozenset({"Prefetch", "ParallelMap", "MapAndBatch", "ParallelInterleave", "LegacyParallelInterleave",
                    "ParallelBatch", "ParallelFilter"})
#: Iterators whose own time is only a wait for the threads that fill their buffer, never work.
_WAITING = frozenset({"Root", "Prefetch"})
#: The measured stage replaces the pick by settings when it takes at least this share.
MEASURED_MIN_SHARE = 0.5


@dataclass(frozen=True)
class MeasuredStage:
    """The stage whose iterators took the most time of their own in the capture."""

    index: int  # into the pipeline's stages
    stage: str
    site: str
    own_s: float
    share: float  # of all the pipeline's iterators' own time over the capture
    iterators: tuple[str, ...]  # tf.data's names for it (a fused stage's, an interleave's inputs)


def _waiting(chain: str) -> bool:
    """Only a wait: ``Root``, a ``Prefetch``, and the per-device ``Generator`` tf.distribute feeds
    from the host pipeline's buffer (a ``from_generator`` of the script's is under a ``FlatMap``)."""
    parts = chain.split("::")
    kind = _component(parts[-1])
    return kind in _WAITING or (kind == "Generator" and (len(parts) < 2 or _component(parts[-2]) != "FlatMap"))


def _component(name: str) -> str:
    """The iterator's own kind: ``Root::ParallelMapV2`` -> ``ParallelMap``; ``Interleave[0]`` -> ``Interleave``."""
    name = name.rsplit("::", 1)[-1].split("[", 1)[0].removesuffix("Dataset")
    base = name.rstrip("0123456789")
    return base[:-1] if base != name and base.endswith("V") else name


def own_times(m: InputStages) -> list[float]:
    """Each iterator's own time: its self time, less, for an asynchronous one, its inputs' whole
    durations (they ran on its threads while its consumer waited); never below 0."""
    chains = list(m.iterators)  # per-element indices already removed by the agent (InputStages)
    busy = m.busy_s if len(m.busy_s) == len(chains) else (0.0,) * len(chains)  # a recording without busy_s
    inputs: dict[str, float] = {}
    for chain, b in zip(chains, busy):
        parent = chain.rsplit("::", 1)[0]
        inputs[parent] = inputs.get(parent, 0.0) + b
    return [max(0.0, self_s - (inputs.get(chain, 0.0) if _component(chain) in _ASYNC else 0.0))
            for chain, self_s in zip(chains, m.self_s)]


def stage_of_iterators(p: Pipeline, iterators: tuple[str, ...]) -> list[int | None]:
    """The index into ``p.stages`` each iterator's work belongs to (None: no stage of the
    script's, like an injected ``Prefetch`` or the ``Root``), walking both chains from the root
    in the same order. An iterator of a function's own datasets (an ``interleave``'s inputs) has
    no stage of the chain: it is charged to the stage it runs under."""
    root_first = list(range(len(p.stages)))[::-1]
    out: list[int | None] = []
    for chain in iterators:
        j = 0
        owner: int | None = None
        inside = False  # below a stage whose function makes datasets of its own
        for part in chain.split("::")[1:]:  # "Root" first
            if inside:
                continue
            kind = _component(part)
            names = _ITERATOR_STAGES.get(kind, (kind.lower(),))
            pair = _FUSED.get(kind)
            if pair is not None:  # the two stages next to each other, else either alone
                fused = [k for k in range(j, len(root_first) - 1)
                         if (p.stages[root_first[k]], p.stages[root_first[k + 1]]) == pair]
                if fused:
                    owner, j = root_first[fused[0] + 1], fused[0] + 2
                    continue
            hits = [k for k in range(j, len(root_first)) if p.stages[root_first[k]] in names]
            if not hits:
                inside = owner is not None
                continue
            k = hits[0]
            while k + 1 < len(root_first) and p.stages[root_first[k + 1]] == p.stages[root_first[k]]:
                k += 1  # one call made two stages (from_generator): the same line
            owner, j = root_first[k], k + 1
        out.append(None if _waiting(chain) else owner)
    return out


def measured_stage(p: Pipeline, m: InputStages) -> MeasuredStage | None:
    """The stage whose iterators took the most time of their own (:func:`own_times`) in ``m``'s
    capture, with its share of all the pipeline's iterators' own time (``Root`` and ``Prefetch``
    left out: they only wait). None when the capture has no iterator events of work."""
    owners = stage_of_iterators(p, m.iterators)
    per: dict[int, float] = {}
    names: dict[int, list[str]] = {}
    total = 0.0
    for chain, own, owner in zip(m.iterators, own_times(m), owners):
        if _waiting(chain):
            continue
        total += own
        if owner is not None:
            per[owner] = per.get(owner, 0.0) + own
            names.setdefault(owner, []).append(chain)
    if not per or total <= 0:
        return None
    top = max(per, key=lambda i: per[i])
    return MeasuredStage(top, p.stages[top], p.sites[top], per[top], per[top] / total, tuple(names[top]))


def stage_culprit(p: Pipeline, index: int) -> Culprit | None:
    """The edit stage ``index`` needs by its settings (the same rules as :func:`culprit`), or
    None when its settings ask for nothing (it is parallel already) or a library added it."""
    if p.added_by[index]:
        return None
    user_idx = [i for i in range(len(p.stages)) if not p.added_by[i]]
    user = _user_stages(p)
    cached = max((i for i, s in enumerate(user) if s[0] == "cache"), default=-1)
    rule = _stage_rule(user, user_idx.index(index), cached)
    return rule[1] if rule else None

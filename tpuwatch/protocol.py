"""The tpuwatch wire format: typed, versioned messages as JSON lines.

Every message the agent produces (and every command a viewer sends) is one of the frozen
dataclasses below, encoded as one compact JSON object per line with its ``kind`` first.
The same lines go to ``events.jsonl`` in the run directory and over the agent's socket.

Rules:
- field names carry units (``step_time_s``, ``current_bytes``);
- values are plain numbers, strings, booleans, ``None``, tuples of those, or flat
  string-keyed mappings of those; non-finite floats travel as the strings
  ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` so every line is strict JSON;
- a line with an unknown ``kind`` is skipped and counted, a malformed one is rejected and
  counted: decoding never raises on bad input (see :class:`Decoder`);
- times are finite: a timestamp ``t`` or a duration (a field named ``*_s``) that is NaN, an
  infinity or beyond :data:`MAX_SECONDS` in size makes the line malformed (the agent never
  writes one; a hand-edited or hostile recording would otherwise overflow every sum of times);
- extra fields from a newer agent are ignored; a missing required field makes the line
  malformed.

This module imports nothing outside the standard library.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Final, Literal, Mapping, Union

PROTOCOL_VERSION = 1

#: Longest line accepted from the wire or a recording (bytes, newline excluded).
MAX_LINE_BYTES = 1 << 20
#: The largest time a message may carry, in seconds either way (about 3,000 years): a unix time
#: or a duration beyond it is no real one, and sums of such would overflow.
MAX_SECONDS = 1e11

#: ``Event.source`` of the agent's note of what a full disk made the run lose (the report lists it).
DISK_FULL_SOURCE = "disk-full"
#: ``Event.source`` of the output pump's warning that the script's output reaches output.log late.
OUTPUT_SOURCE = "output"

#: The most of a command line a ``hello`` (or run.json) carries, in characters: a longer one is cut,
#: its last entry saying how much is left out (a 1.56 MB argv made the hello a line no reader takes).
MAX_ARGV_CHARS = 64 * 1024
#: ... and the most of one argument kept.
MAX_ARG_CHARS = 4096


def clip_argv(argv: "typing.Iterable[str]") -> list[str]:
    """``argv`` within :data:`MAX_ARGV_CHARS` (each argument within :data:`MAX_ARG_CHARS`); what is
    cut is counted in a last entry ``"… (N more arguments, M characters, left out)"``."""
    out: list[str] = []
    total = 0
    items = list(argv)
    for i, arg in enumerate(items):
        cut = len(arg) - MAX_ARG_CHARS
        shown = arg if cut <= 0 else f"{arg[:MAX_ARG_CHARS]}… ({cut:,} more characters)"
        if total + len(shown) > MAX_ARGV_CHARS:
            rest = items[i:]
            out.append(f"… ({len(rest):,} more arguments, {sum(map(len, rest)):,} characters, left out)")
            break
        out.append(shown)
        total += len(shown)
    return out


Scalar = Union[int, float, str, bool, None]
Level = Literal["debug", "info", "warning", "error"]
Severity = Literal["info", "warning", "critical"]
#: Severities from the least to the most serious (every ordering of findings uses this).
SEVERITY_RANK: Mapping[str, int] = {"info": 0, "warning": 1, "critical": 2}

_NONFINITE_OUT = {math.inf: "Infinity", -math.inf: "-Infinity"}
_NONFINITE_IN = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class ProtocolError(ValueError):
    """A line that is not a valid message of this protocol."""


@dataclass(frozen=True)
class Message:
    """Base of all messages. ``kind`` is a class constant written on the wire."""

    kind: ClassVar[str] = ""


# --- run lifecycle -------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello(Message):
    """First message of every agent: who is running what."""

    kind: ClassVar[str] = "hello"
    protocol_version: int
    agent_version: str
    run_id: str
    t: float  # unix time, seconds
    pid: int
    host: str
    worker: str  # stable name of this process in a multi-worker job ("host:pid" by default)
    python_version: str
    tf_version: str
    keras_version: str
    script: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class Topology(Message):
    """The distribution strategy, as soon as the script has made one (or first trains)."""

    kind: ClassVar[str] = "topology"
    t: float
    strategy: str  # class name, e.g. "MirroredStrategy", "TPUStrategyV2", "_DefaultDistributionStrategy"
    replicas: int  # replicas in sync, across all workers
    local_replicas: int  # replicas driven by this process
    num_workers: int
    worker_index: int
    device_kind: str  # "TPU v4", "GPU", "CPU", ...
    devices: tuple[str, ...]  # this worker's replica devices, in replica order
    is_tpu: bool


@dataclass(frozen=True)
class Config(Message):
    """Training configuration learned while the script runs. ``None`` fields are unknown/unchanged."""

    kind: ClassVar[str] = "config"
    t: float
    mixed_precision: str | None = None  # Keras global dtype policy name, e.g. "mixed_bfloat16"
    global_batch_size: int | None = None
    per_replica_batch_size: int | None = None
    steps_per_execution: int | None = None
    # The global step count at which the current Keras fit ends (its first step - 1 + epochs x
    # steps per epoch), when known; past it, the run is doing something else.
    total_steps: int | None = None
    epochs: int | None = None
    keras_version: str | None = None  # the Keras that runs fit ("3.15.1", or "tf_keras 2.21.0")


@dataclass(frozen=True)
class Step(Message):
    """One call of the step function: ``steps`` training steps (k with steps_per_execution=k).

    Times are per training step (the call's time divided by ``steps``).

    Its fields are listed here and nowhere else: the agent's :func:`step_values`, the encoder's
    fast path and the recording's :func:`decode_step_line` are made from them (see "Add a field
    to Step" in docs/architecture.md).
    """

    kind: ClassVar[str] = "step"
    step: int  # global step count after this record (1-based)
    t: float  # unix time at the end of the call
    step_time_s: float
    input_wait_s: float | None  # host time waiting for input, per step; None if not measured
    loss: float | None  # mean over this worker's replicas (what strategy.reduce(MEAN) gives)
    replica_losses: tuple[float, ...] = ()  # one per local replica, in replica order
    steps: int = 1
    examples: int | None = None  # examples per training step across this worker's replicas
    function: str = ""  # name of the step function
    epoch: int | None = None


@dataclass(frozen=True)
class StepLoss(Message):
    """The losses of a step recorded earlier without them, read once nothing has run since.

    Losses are sampled (every record at first, then at most every 0.25 s of training, less often
    where a read is costly), so a
    record may carry none; when training pauses (the script ends, an epoch ends, evaluation
    starts) the last step's losses are read and sent here, for the step they belong to.
    """

    kind: ClassVar[str] = "step_loss"
    t: float
    step: int  # the global step of the record these losses belong to
    loss: float | None  # mean over this worker's replicas
    replica_losses: tuple[float, ...] = ()


@dataclass(frozen=True)
class HostSample(Message):
    """Periodic host-side sample."""

    kind: ClassVar[str] = "host_sample"
    t: float
    rss_bytes: int
    available_bytes: int
    total_bytes: int
    cpu_percent: float  # of one core (may exceed 100 on several cores)
    load_1m: float | None = None  # the host's 1-minute load average (older recordings: absent)


@dataclass(frozen=True)
class DeviceSample(Message):
    """Periodic device memory sample for one device (one TPU core, one GPU, the CPU allocator)."""

    kind: ClassVar[str] = "device_sample"
    t: float
    device: str
    current_bytes: int
    peak_bytes: int
    limit_bytes: int | None = None
    source: str = "tf"  # "tf" (get_memory_info), "tpu-info", "nvml", ...
    limit_source: str = ""  # where the limit came from ("chip table v4", "memory_limit", ...)
    duty_cycle_pct: float | None = None


@dataclass(frozen=True)
class Retrace(Message):
    """A tf.function was traced (again). ``change`` says what differed from its previous trace."""

    kind: ClassVar[str] = "retrace"
    t: float
    function: str
    traces: int  # traces of functions with this name so far (all instances)
    instances: int  # distinct tf.function objects with this name created so far
    signature: str  # the new trace's input signature, short form
    change: str  # e.g. "x: shape (96, 28, 28, 1) -> (64, 28, 28, 1)"; "" for the first trace
    step: int | None = None  # global step when it happened
    #: An evaluation function: its trace computed no gradient, in a run that had trained (Keras'
    #: test function under ``fit(validation_data=...)``, a custom loop's test step). Counted
    #: apart from training functions of the same name (``traces``/``instances`` are its own).
    evaluation: bool = False
    #: The script's line whose call traced (``train.py:41``; under Keras the ``fit`` line) and
    #: its source text; "" when no frame of the script's was on the stack.
    call_site: str = ""
    call_code: str = ""


@dataclass(frozen=True)
class Pipeline(Message):
    """The tf.data pipeline a training iterates: its stages from the source to the last, one
    entry per stage in each tuple (sent once per dataset, when its first iterator is made, and
    once more, with ``consumer_site``, when a batch of it is first fetched eagerly: a later
    message for the same ``dataset`` replaces the earlier).

    ``sites`` is the script's ``file:line`` that created the stage ("" when unknown; a stage that
    Keras or tf.distribute added carries the user's line that led to it, and ``added_by`` says
    who); ``settings`` its arguments (``num_parallel_calls=AUTOTUNE``, ``buffer_size=1024``...);
    ``holds_bytes`` what the stage can keep in host memory (an in-memory ``cache``: the data it
    caches; ``shuffle``: its buffer), 0 for none, -1 unknown.
    """

    kind: ClassVar[str] = "pipeline"
    t: float
    dataset: int  # 1, 2, ... in the order the training first iterates them
    consumer: str  # "iterator", "experimental_distribute_dataset", "distribute_datasets_from_function"
    stages: tuple[str, ...]  # the API that made each stage: "from_tensor_slices", "map", "batch"
    sites: tuple[str, ...]
    settings: tuple[str, ...]
    code: tuple[str, ...]  # the stage's source line as written (truncated)
    holds_bytes: tuple[int, ...]
    added_by: tuple[str, ...]  # "" (the script), "keras", "tf.distribute", "tensorflow"
    elements: int | None = None  # elements per pass at the last stage (None: infinite/unknown)
    #: the script's ``file:line`` that fetches the dataset's batches eagerly, between steps
    #: (``for batch in dist_dataset``, ``for x, y in dataset``, ``next(iterator)`` outside a
    #: tf.function): "" when they are fetched inside the step, or not yet
    consumer_site: str = ""
    #: TensorFlow adds a ``prefetch(AUTOTUNE)`` after a synchronous last stage (its
    #: ``inject_prefetch`` rewrite, on unless the dataset's options turn off autotune,
    #: ``inject_prefetch`` or the default optimizations); None: not known (read as True: every
    #: TensorFlow tpuwatch supports does so by default)
    tf_prefetch: bool | None = None
    #: per stage: TensorFlow runs it in parallel by itself (``num_parallel_calls=AUTOTUNE``): a
    #: ``map`` written without ``num_parallel_calls`` whose function is stateless, under its
    #: ``map_parallelization`` rewrite (on unless the options turn it, autotune or the default
    #: optimizations off); empty: not known (read as no stage)
    tf_parallel: tuple[bool, ...] = ()
    #: what the dataset is for, where Keras iterates it: "train" (``fit``), "validation" (``fit``'s
    #: validation data), "test" (``evaluate``), "predict"; "" where the script's own loop does
    use: str = ""


@dataclass(frozen=True)
class AllocationSites(Message):
    """Where host memory grew, by the script's lines: Python allocations (tracemalloc; NumPy
    reports its buffers to it) sampled over one bounded window once growth was suspected.

    One entry per site in each tuple, largest growth first. ``kinds`` says what allocated there:
    the library whose code made the allocation ("numpy", "tensorflow") or "python" for the
    script's own objects; "tensors" ("scalar tensors") for eager tensors kept alive, which
    tracemalloc does not see (``blocks``: how many; the site "" when the line that keeps them was
    not found). The step times say what the window cost (inside it vs just before).
    """

    kind: ClassVar[str] = "allocation_sites"
    t: float
    window_s: float
    step_from: int
    step_to: int
    step_time_inside_s: float | None
    step_time_before_s: float | None
    sites: tuple[str, ...]  # "train.py:71"
    grown_bytes: tuple[int, ...]
    blocks: tuple[int, ...]  # allocations alive at the end of the window that were not at its start
    kinds: tuple[str, ...]
    code: tuple[str, ...]
    traced_bytes: int = 0  # all growth tracemalloc saw in the window (the script's or not)
    #: RSS growth over the window (None: recorded before the field); a window with no step in it
    #: is never sent
    rss_grown_bytes: int | None = None


@dataclass(frozen=True)
class HostSites(Message):
    """Where the training thread spends the time between step calls, by the script's lines: the
    agent's sampler thread looks at the training thread's stack (``sys._current_frames``) at its
    sample rate and, when no step call is under way and the process is training, charges the
    sample to the innermost frame of the script (or of a module of the user's). Counts are over the
    whole run so far; one message every few seconds while they change.

    One entry per site in each tuple, most samples first (at most 8). ``samples`` are all the
    samples taken between steps, ``script_samples`` those a frame of the script's was on the stack
    for (the rest were Keras' or TensorFlow's own code), ``step_samples`` those taken while a step
    call ran. ``kinds`` says what the line spends its time on: "numpy" (NumPy's code below it),
    "tensor read" (a tensor read back to the host: ``.numpy()``, ``get_weights()``), "logging"
    (``print``, ``logging``, a file write), "python" (the script's own code). ``roles`` says where
    the line runs: "generator" (a Python generator of the script's making the batches: ``callers``
    holds the line that consumes it), "callback" (a Keras callback's method: ``callers`` holds
    its ``Class.method``), or "loop".
    """

    kind: ClassVar[str] = "host_sites"
    t: float
    samples: int
    script_samples: int
    step_samples: int
    sample_interval_s: float  # the samples' mean spacing, from the look before each (the looks' pace varies)
    sites: tuple[str, ...]  # "train.py:71"
    counts: tuple[int, ...]
    kinds: tuple[str, ...]
    roles: tuple[str, ...]
    functions: tuple[str, ...]  # the script function the line is in
    callers: tuple[str, ...]
    code: tuple[str, ...]


@dataclass(frozen=True)
class Teardown(Message):
    """TensorFlow took long (at least 2 s) to delete a tf.data iterator on the training thread,
    with no step call under way: an epoch's iterator dropped at its boundary, or the script's at
    its end. Deleting one joins tf.data's own threads (its autotune thread, which sleeps for its
    optimization period; a prefetch; a map element still being computed), so the training thread
    waits in C++ with no Python frame of TensorFlow's: the agent times it from the iterator's last
    reference dropping to its resource freed. Sent once it ends, before the next step's record;
    while it lasts, past 2 s, the agent's thread sends it every second with ``under_way`` (the
    same ``since``, ``t`` now): a viewer names it live.
    """

    kind: ClassVar[str] = "teardown"
    t: float  # unix time the deletion ended
    since: float  # unix time it began
    cpu_s: float  # the process's CPU seconds (all its threads) during it
    iterator: str  # TensorFlow's class: "OwnedIterator", "OwnedMultiDeviceIterator"
    step: int  # the global step before it
    #: The training thread's Python frames during it, innermost first (tpuwatch's own left out):
    #: ``train.py:48 in main: del it``; empty when no sample fell inside it.
    stack: tuple[str, ...] = ()
    #: Of those, the script's innermost (the line that dropped the iterator, or the script's call
    #: into Keras that did: ``train.py:60 in <module>: model.fit(ds, epochs=3)``); "" if none.
    site: str = ""
    under_way: bool = False  # not ended yet: ``t`` is when the agent's thread last looked


@dataclass(frozen=True)
class InputStages(Message):
    """Which tf.data stage the input wait comes from, measured: tf.data's own iterator events in a
    short profile the agent captured when the step began to wait for input (``tpuwatch run
    --no-auto-profile`` turns it off).

    One entry per iterator in each tuple, root first. ``iterators`` are tf.data's names for them
    after its graph rewrites, the chain from the root without ``Iterator::`` and without the
    per-element index of an interleave's or flat_map's inputs (``Root::Prefetch::MapAndBatch``,
    ``Root::Interleave::Map`` for ``Root::Interleave[3]::Map``: one entry whatever input it
    read); ``self_s`` is each one's self time over the capture (its events' durations minus those
    of the iterator events nested in them on the same thread).
    ``busy_s`` are their whole durations (an asynchronous stage's input runs on its own threads,
    so its consumer's self time holds the wait for that input). ``fetch_s`` is the consumer's time
    inside tf.data (the root iterators' durations). The step times say what the capture cost:
    just before it, during it (its stop included), just after.
    """

    kind: ClassVar[str] = "input_stages"
    t: float
    path: str  # the capture's directory (the profile command's Result has the same path)
    step_from: int
    step_to: int
    capture_s: float
    fetch_s: float
    iterators: tuple[str, ...]
    self_s: tuple[float, ...]
    calls: tuple[int, ...]
    busy_s: tuple[float, ...] = ()  # each iterator's events' durations
    step_time_before_s: float | None = None
    step_time_inside_s: float | None = None
    step_time_after_s: float | None = None


#: ``Retrace.change`` of the trace TF makes again, same inputs, when a function's first call
#: created variables (lazily built optimizer slots, a model built inside the step): a real trace,
#: counted as TF counts it, but no retrace problem (it happens once per function).
VARIABLES_MADE_CHANGE = "the first call created variables, so TF traced it again (same inputs)"
@dataclass(frozen=True)
class SlowSteps(Message):
    """Steps that turned several times slower than the run's own median, and the profile the
    agent captured by itself while they lasted (shares the auto-profile's budget).

    Times are per training step: ``slow_*`` over the steps inside the capture, ``normal_*`` over
    the steps before the slowdown began; ``*_wait_s`` the input wait (None: not measured),
    ``*_between_s`` the host time between two step calls (the script's Python between steps).
    """

    kind: ClassVar[str] = "slow_steps"
    t: float
    path: str  # the capture's directory ("" when the capture failed; ``error`` says why)
    function: str
    first_slow_step: int  # the first step of the slowdown
    step_from: int  # the capture's steps
    step_to: int
    slow_step_s: float
    normal_step_s: float
    slow_wait_s: float | None = None
    normal_wait_s: float | None = None
    slow_between_s: float | None = None
    normal_between_s: float | None = None
    error: str = ""


#: ``Retrace.change`` of a trace of a new tf.function object (same name, same inputs): what made
#: TF trace is the new object, not a difference to any trace it had (the agent writes it, the
#: viewer's state and the retrace rule compare with it).
NEW_OBJECT_CHANGE = "new tf.function object, same inputs"
#: The id of every ``profile`` command the agent sends itself (the auto-profile, :class:`InputStages`):
#: ``auto-profile-1``, ... The viewer leaves the steps inside such a capture out of its step-time
#: and input figures (the profiler's own overhead, not the script's).
AUTO_PROFILE_ID_PREFIX = "auto-profile-"


@dataclass(frozen=True)
class Epoch(Message):
    kind: ClassVar[str] = "epoch"
    t: float
    epoch: int  # 0-based, as Keras counts
    phase: Literal["begin", "end"]
    step: int | None = None
    logs: Mapping[str, Scalar] = field(default_factory=dict)


class EventFact:
    """What an :class:`Event` states for a reader that acts on it (``Event.fact``), beside the
    message written for people. The agent, the launcher and the viewer import these, so a
    reworded message changes no panel. On the wire a plain string: a reader skips one it does
    not know, and ``""`` is an event for the log only."""

    STOP_REQUESTED: Final = "stop-requested"  # subject: who asked (the run is stopped, not crashed)
    PROBE_DISABLED: Final = "probe-disabled"  # subject: the probe; reason: why it was switched off
    TPU_METRICS_UNAVAILABLE: Final = "tpu-metrics-unavailable"  # reason: why libtpu's metrics are absent
    TPU_METRICS_AVAILABLE: Final = "tpu-metrics-available"  # they arrive (again)
    DEVICE_MEMORY_UNAVAILABLE: Final = "device-memory-unavailable"  # subject: the device; reason: why


#: What the training process is doing, coarsely (see :class:`Phase`).
PhaseName = Literal["starting", "training", "compiling", "evaluating", "checkpointing", "iterator",
                    "host", "finishing"]
PHASE_NAMES: tuple[str, ...] = typing.get_args(PhaseName)


@dataclass(frozen=True)
class Phase(Message):
    """The training process changed what it is doing (never sent per step).

    ``starting``: launch to the first step call; ``training``: step calls (and the host time
    between them); ``compiling``: not sent by this agent (a trace is a :class:`Retrace`, sent
    when it begins; the ledger and the stall rule read traces from those); ``evaluating``: Keras validation,
    ``evaluate``, ``predict``, or a custom loop's tf.function / ``strategy.run`` that computes no
    gradient; ``checkpointing``: a checkpoint or model save; ``iterator``: a new iterator over a
    distributed dataset (a custom loop's epoch boundary); ``host``: the script's own Python after
    one of those; ``finishing``: the script returned, the process is exiting.

    While a phase lasts, the agent's thread sends it again at its sample rate whenever ``calls``
    grew (an evaluation's progress), with the same ``since``: a re-sent phase is progress, not a
    change.
    """

    kind: ClassVar[str] = "phase"
    t: float  # unix time of this message
    phase: PhaseName
    since: float  # unix time the phase began
    detail: str = ""  # the function, callback or method ("test_step", "ModelCheckpoint", "Checkpoint.save")
    step: int | None = None  # global step when it began
    calls: int = 0  # top-level calls made in this phase so far (an evaluation's test steps)


@dataclass(frozen=True)
class Event(Message):
    """A run event worth a line in the event log (probe disabled, strategy detected, ...)."""

    kind: ClassVar[str] = "event"
    t: float
    level: Level
    source: str  # "agent", "probe:<name>", "launcher", "keras", ...
    message: str
    fact: str = ""  # an EventFact, or "" (read it with event_fact: older recordings lack it)
    subject: str = ""
    reason: str = ""


#: ``Event.source`` of the events about TPU metrics, and of a stop request (older recordings).
TPU_METRICS_SOURCE = "tpu-metrics"
STOP_SOURCE = "viewer"
_LEGACY_STOP = "stop requested"
_LEGACY_TPU_UNAVAILABLE = "TPU metrics unavailable: "
_LEGACY_NO_MEMORY_INFO = "no memory info for "


def event_fact(msg: Event) -> tuple[str, str, str]:
    """``(fact, subject, reason)`` of an event: its fields, or for a recording made before they
    existed (agent 0.1 without ``Event.fact``) what its message said in the words of that time."""
    if msg.fact:
        return msg.fact, msg.subject, msg.reason
    if msg.source == STOP_SOURCE and msg.message.startswith(_LEGACY_STOP):
        return EventFact.STOP_REQUESTED, msg.message[len(_LEGACY_STOP):].removeprefix(" from "), ""
    if msg.source == TPU_METRICS_SOURCE:
        if msg.message.startswith(_LEGACY_TPU_UNAVAILABLE):
            return EventFact.TPU_METRICS_UNAVAILABLE, "", msg.message[len(_LEGACY_TPU_UNAVAILABLE):]
        return EventFact.TPU_METRICS_AVAILABLE, "", ""
    if msg.source == "probe:memory" and msg.message.startswith(_LEGACY_NO_MEMORY_INFO):
        device, _, reason = msg.message[len(_LEGACY_NO_MEMORY_INFO):].partition(": ")
        return EventFact.DEVICE_MEMORY_UNAVAILABLE, device, reason
    if msg.source.startswith("probe:") and "disabled" in msg.message:
        _, _, reason = msg.message.partition("disabled: ")
        return EventFact.PROBE_DISABLED, msg.source[len("probe:"):], reason or msg.message
    return "", "", ""


@dataclass(frozen=True)
class ExceptionRaised(Message):
    """The script raised out of ``__main__``."""

    kind: ClassVar[str] = "exception"
    t: float
    type: str
    message: str
    traceback: str


@dataclass(frozen=True)
class Exit(Message):
    """The end of the run. The launcher writes one if the agent could not (killed by a signal)."""

    kind: ClassVar[str] = "exit"
    t: float
    exit_code: int  # shell convention: 128+N for signal N
    signal: int | None = None
    source: Literal["agent", "launcher"] = "agent"
    reason: str = ""


# --- commands ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Command(Message):
    """A viewer asks the agent to act. Gets exactly one :class:`Result` with the same ``id``."""

    kind: ClassVar[str] = "command"
    id: str
    action: str
    args: Mapping[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True)
class CommandState(Message):
    """Progress of an accepted command: "queued" -> "running" (then its Result)."""

    kind: ClassVar[str] = "command_state"
    t: float
    id: str
    action: str
    state: Literal["queued", "running"]
    step: int | None = None


@dataclass(frozen=True)
class Result(Message):
    kind: ClassVar[str] = "result"
    t: float
    id: str
    action: str
    ok: bool
    message: str  # one line: what happened, or what is wrong and what to do
    details: Mapping[str, Scalar] = field(default_factory=dict)  # path, bytes, seconds, step, ...


@dataclass(frozen=True)
class StackDump(Message):
    """Every thread's Python stack at one moment: asked for (the ``stack_dump`` command), or
    taken by the agent itself when steps stopped (``reason`` "stall")."""

    kind: ClassVar[str] = "stack_dump"
    t: float
    text: str
    path: str = ""
    reason: str = ""  # "": a viewer asked; "stall": no step for the agent's stall limit
    step: int | None = None  # the global step the stacks were taken after
    gap_s: float | None = None  # "stall": seconds without a step when they were taken
    #: The training thread in one line: "waiting at train.py:26: time.sleep(40)".
    headline: str = ""
    #: Where the training thread stood: "script" (its own Python), "input" (waiting for the
    #: step's input), "step" (inside a step call: TensorFlow's native code, a collective or an
    #: in-graph input fetch), "tensorflow" (other TensorFlow or Keras code), "" (unknown).
    stalled_in: str = ""
    #: The innermost line of the script's a thread of tf.data runs ("gen.py:12: time.sleep(1)":
    #: a generator or py_function of the pipeline), when one shows.
    input_line: str = ""


# --- diagnostics -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding(Message):
    kind: ClassVar[str] = "finding"
    t: float
    rule: str
    severity: Severity
    message: str
    advice: str
    evidence: Mapping[str, Scalar] = field(default_factory=dict)
    first_step: int | None = None
    last_step: int | None = None
    worker: str = ""


# --- transport handshake ---------------------------------------------------------------------


@dataclass(frozen=True)
class Attach(Message):
    """First line a viewer sends on the agent socket.

    ``offset`` is the byte offset in events.jsonl to stream from (0: everything; -1: nothing,
    commands only). ``token`` is required on TCP.
    """

    kind: ClassVar[str] = "attach"
    protocol_version: int
    offset: int = 0
    token: str = ""
    viewer: str = ""
    # Ask for the summary stream: the recording from ``offset`` with its per-step records and
    # samples folded into one :class:`HostSummary` about once a second (a viewer of many hosts).
    # An agent that predates the field ignores it and streams every line.
    summary: bool = False


@dataclass(frozen=True)
class HostSummary(Message):
    """One host's step records and samples since the previous summary, folded by its agent's
    transport for a viewer that asked for summaries (:attr:`Attach.summary`). Never recorded:
    the recording keeps every record; every other kind travels to that viewer as recorded.

    ``offset_bytes`` is the recording's byte offset this summary accounts for: the agent sends
    one before every line it passes on, so a viewer's offset is this value plus the lengths of
    the lines after it (where it re-attaches, in either mode, losing and repeating nothing).
    """

    kind: ClassVar[str] = "host_summary"
    t: float  # unix time the agent built it
    offset_bytes: int
    records: int = 0  # step records folded in
    steps: int = 0  # training steps in them (k per record with steps_per_execution = k)
    step: int | None = None  # the newest record's global step
    step_t: float | None = None  # its unix time
    function: str = ""  # its step function
    epoch: int | None = None
    step_time_p50_s: float | None = None  # over the records' per-step times
    step_time_p95_s: float | None = None
    step_time_max_s: float | None = None
    step_time_sum_s: float = 0.0  # sum of step_time_s x steps: the interval's step time
    input_wait_sum_s: float = 0.0  # sum of input_wait_s x steps over records that measured it
    input_wait_steps: int = 0  # steps whose input wait was measured
    input_wait_p50_s: float | None = None  # over the records that measured it
    loss: float | None = None  # the newest losses read in the interval (none: none were)
    replica_losses: tuple[float, ...] = ()
    loss_step: int | None = None  # the step those losses belong to
    host_t: float | None = None  # the newest host sample, as recorded (None: none in the interval)
    rss_bytes: int | None = None
    available_bytes: int | None = None
    total_bytes: int | None = None
    cpu_percent: float | None = None
    load_1m: float | None = None
    # The newest sample of each device in the interval, in the order first seen.
    devices: tuple[str, ...] = ()
    device_t: tuple[float, ...] = ()
    device_current_bytes: tuple[int, ...] = ()
    device_peak_bytes: tuple[int, ...] = ()
    device_limit_bytes: tuple[int, ...] = ()  # 0: no limit known
    device_source: str = ""  # of the first device ("tf", "tpu-info", ...)
    device_limit_source: str = ""

    def host_sample(self) -> HostSample | None:
        """The newest host sample it carries, as recorded (None: none in the interval)."""
        if self.host_t is None or self.rss_bytes is None:
            return None
        return HostSample(t=self.host_t, rss_bytes=self.rss_bytes, available_bytes=self.available_bytes or 0,
                          total_bytes=self.total_bytes or 0, cpu_percent=self.cpu_percent or 0.0,
                          load_1m=self.load_1m)

    def device_samples(self) -> tuple[DeviceSample, ...]:
        """The newest sample of each device it carries, as recorded. Built once per message (a
        viewer's state and its diagnostics both read them; not a field, so not on the wire)."""
        cached: tuple[DeviceSample, ...] | None = self.__dict__.get("_device_samples")
        if cached is not None:
            return cached
        n = min(len(self.devices), len(self.device_t), len(self.device_current_bytes),
                len(self.device_peak_bytes), len(self.device_limit_bytes))
        out = tuple(DeviceSample(t=self.device_t[i], device=self.devices[i], current_bytes=self.device_current_bytes[i],
                                 peak_bytes=self.device_peak_bytes[i], limit_bytes=self.device_limit_bytes[i] or None,
                                 source=self.device_source, limit_source=self.device_limit_source)
                    for i in range(n))
        self.__dict__["_device_samples"] = out  # frozen: set beside the fields, as cached_property does
        return out


MESSAGE_TYPES: tuple[type[Message], ...] = (
    Hello,
    Topology,
    Config,
    Step,
    StepLoss,
    HostSample,
    DeviceSample,
    Retrace,
    Pipeline,
    AllocationSites,
    HostSites,
    Teardown,
    InputStages,
    SlowSteps,
    Epoch,
    Phase,
    Event,
    ExceptionRaised,
    Exit,
    Command,
    CommandState,
    Result,
    StackDump,
    Finding,
    Attach,
    HostSummary,
)
BY_KIND: dict[str, type[Message]] = {cls.kind: cls for cls in MESSAGE_TYPES}


# --- encoding ----------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    t = type(value)
    if t is str or t is int or t is bool or value is None:  # most fields: no ABC check
        return value
    if isinstance(value, float):
        if value != value:
            return "NaN"
        return _NONFINITE_OUT.get(value, value)
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def to_dict(msg: Message) -> dict[str, Any]:
    cls = type(msg)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(msg))
    out: dict[str, Any] = {"kind": msg.kind}
    for name in names:
        out[name] = _plain(getattr(msg, name))
    return out


def _num(v: Any) -> Any:
    if type(v) is float and (v != v or v in _NONFINITE_OUT):
        return "NaN" if v != v else _NONFINITE_OUT[v]
    return v


_DUMPS = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def encode(msg: Message) -> bytes:
    """One message as one JSON line (with the trailing newline)."""
    data = _step_dict(msg) if type(msg) is Step else to_dict(msg)
    return (_DUMPS(data) + "\n").encode()


# --- decoding ----------------------------------------------------------------------------------


def _checker(tp: Any) -> Callable[[Any], Any]:
    """Builds a function that validates/converts one decoded JSON value for type ``tp``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return lambda v: v
    if origin in (Union, types.UnionType):
        checks = [_checker(a) for a in args]

        def check_union(v: Any) -> Any:
            for c in checks:
                try:
                    return c(v)
                except ProtocolError:
                    pass
            raise ProtocolError(f"{v!r} is not {tp}")

        return check_union
    if origin is Literal:
        allowed = set(args)

        def check_literal(v: Any) -> Any:
            if v not in allowed:
                raise ProtocolError(f"{v!r} not one of {sorted(map(str, allowed))}")
            return v

        return check_literal
    if origin is tuple:
        item = _checker(args[0])

        def check_tuple(v: Any) -> Any:
            if not isinstance(v, list):
                raise ProtocolError(f"expected a list, got {type(v).__name__}")
            return tuple(item(x) for x in v)

        return check_tuple
    if origin in (collections.abc.Mapping, dict):
        val: Callable[[Any], Any] = _checker(args[1]) if args else (lambda v: v)

        def check_mapping(v: Any) -> Any:
            if not isinstance(v, dict):
                raise ProtocolError(f"expected an object, got {type(v).__name__}")
            return {str(k): val(x) for k, x in v.items()}

        return check_mapping
    if tp is type(None):

        def check_none(v: Any) -> Any:
            if v is not None:
                raise ProtocolError("expected null")
            return None

        return check_none
    if tp is bool:

        def check_bool(v: Any) -> Any:
            if not isinstance(v, bool):
                raise ProtocolError("expected a boolean")
            return v

        return check_bool
    if tp is int:

        def check_int(v: Any) -> Any:
            if isinstance(v, bool) or not isinstance(v, int):
                raise ProtocolError(f"expected an integer, got {v!r}")
            return v

        return check_int
    if tp is float:

        def check_float(v: Any) -> Any:
            if isinstance(v, bool):
                raise ProtocolError("expected a number")
            if isinstance(v, (int, float)):
                return float(v)
            if isinstance(v, str) and v in _NONFINITE_IN:
                return _NONFINITE_IN[v]
            raise ProtocolError(f"expected a number, got {v!r}")

        return check_float
    if tp is str:

        def check_str(v: Any) -> Any:
            if not isinstance(v, str):
                raise ProtocolError(f"expected a string, got {type(v).__name__}")
            return v

        return check_str
    raise TypeError(f"unsupported protocol field type {tp!r}")


def _scalar(v: Any) -> Any:
    if isinstance(v, str) and v in _NONFINITE_IN:
        return _NONFINITE_IN[v]
    if v is None or isinstance(v, (int, float, str, bool)):
        return v
    raise ProtocolError(f"expected a plain value, got {type(v).__name__}")


def is_time_field(name: str) -> bool:
    """Whether a field holds seconds (a unix time ``t``, a duration ``*_s``): finite, bounded."""
    return name == "t" or name.endswith("_s")


def _check_seconds(v: Any) -> Any:
    if isinstance(v, float) and not -MAX_SECONDS <= v <= MAX_SECONDS:  # NaN fails it too
        raise ProtocolError(f"{v!r} is not a time in seconds (a finite number within ±{MAX_SECONDS:g})")
    return v


def _schema(cls: type[Message]) -> list[tuple[str, Callable[[Any], Any], bool]]:
    hints = typing.get_type_hints(cls, globalns={**globals(), "Scalar": Any})
    fields = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        check = _checker(tp)
        if is_time_field(f.name):
            plain = check
            if typing.get_origin(tp) is tuple:
                def check(v: Any, plain: Callable[[Any], Any] = plain) -> Any:
                    return tuple(_check_seconds(x) for x in plain(v))
            else:
                def check(v: Any, plain: Callable[[Any], Any] = plain) -> Any:
                    return _check_seconds(plain(v))
        if typing.get_origin(tp) in (collections.abc.Mapping, dict):
            inner = check

            def check(v: Any, inner: Callable[[Any], Any] = inner) -> Any:  # mapping values must be plain scalars
                return {k: _scalar(x) for k, x in inner(v).items()}

        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        fields.append((f.name, check, required))
    return fields


_SCHEMAS = {kind: (cls, _schema(cls)) for kind, cls in BY_KIND.items()}


def from_dict(obj: Any) -> Message | None:
    """Validates a decoded JSON object. Returns ``None`` for an unknown kind.

    Raises :class:`ProtocolError` for anything malformed.
    """
    if not isinstance(obj, dict):
        raise ProtocolError("a message must be a JSON object")
    kind = obj.get("kind")
    if not isinstance(kind, str):
        raise ProtocolError("a message needs a string 'kind'")
    entry = _SCHEMAS.get(kind)
    if entry is None:
        return None
    cls, fields = entry
    kwargs = {}
    for name, check, required in fields:
        if name in obj:
            try:
                kwargs[name] = check(obj[name])
            except ProtocolError as e:
                raise ProtocolError(f"{kind}.{name}: {e}") from None
        elif required:
            raise ProtocolError(f"{kind}: missing field {name!r}")
    return cls(**kwargs)


def decode(line: bytes | str) -> Message | None:
    """Decodes one line. ``None`` for an unknown kind; :class:`ProtocolError` if malformed."""
    if len(line) > MAX_LINE_BYTES:
        raise ProtocolError(f"line of {len(line)} bytes exceeds {MAX_LINE_BYTES}")
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        raise ProtocolError(f"not JSON: {e}") from None
    except RecursionError:
        raise ProtocolError("JSON nested too deeply") from None
    return from_dict(obj)


@dataclass
class Decoder:
    """Decodes lines and counts what it had to skip; never raises on bad input."""

    unknown: int = 0
    malformed: int = 0
    last_error: str = ""

    def decode(self, line: bytes | str) -> Message | None:
        try:
            msg = decode(line)
        except ProtocolError as e:
            self.malformed += 1
            self.last_error = str(e)
            return None
        if msg is None:
            self.unknown += 1
        return msg


# --- Step's fast paths -------------------------------------------------------------------------
#
# A Step is most of a recording (thousands a second), so it has three fast paths beside the
# generic ones: the agent's training thread keeps only its values (:func:`step_values`), the
# encoder writes it without the generic walk (``_step_dict``), a reader builds it straight from the
# parsed line (:func:`decode_step_line`). All three are generated here from ``Step``'s fields, as
# ``dataclasses`` generates ``__init__``: a loop over the fields at run time cost three times as
# much (2.3 µs against 0.8 µs a dict). A field of a type not in ``_FAST_TYPES`` stops the import,
# so no field can be left off a fast path.

#: How each field type is written and checked on the fast paths: (encode, decode) as code, with
#: ``{v}`` the value. A decode that returns ``None`` (from the generated function) or raises
#: TypeError sends the line to the full decoder, which says what is wrong.
_FAST_TYPES: dict[str, tuple[str, str, str]] = {
    "int": ("{v}", "if type({v}) is not int: return None", "_int({v})"),
    "float": ("_num({v})", "{v} = _float({v})", "_fj({v})"),
    "str": ("{v}", "if type({v}) is not str: return None", "_sj({v})"),
    "int | None": ("{v}", "if {v} is not None and type({v}) is not int: return None",
                   "'null' if {v} is None else _int({v})"),
    "float | None": ("_num({v})", "if {v} is not None: {v} = _float({v})", "'null' if {v} is None else _fj({v})"),
    "tuple[float, ...]": ("[_num(x) for x in {v}]", "{v} = tuple(map(_float, {v}))",
                          "'[' + ','.join(map(_fj, {v})) + ']'"),
}
#: The writer's common case, tested inline with no call (``str`` of a finite float is its JSON, of
#: an int too; a name written before is in ``_STR_JSON``): (the test, the text); anything else
#: takes the column above.
_PLAIN_WRITE: dict[str, tuple[str, str]] = {
    "int": ("type({v}) is int", "{v}"),
    "float": ("type({v}) is float and {v} - {v} == 0.0", "{v}"),
    "str": ("{v} in _STR_JSON", "_STR_JSON[{v}]"),
    "int | None": ("({v} is None or type({v}) is int)", "'null' if {v} is None else {v}"),
    "float | None": ("({v} is None or type({v}) is float and {v} - {v} == 0.0)", "'null' if {v} is None else {v}"),
    "tuple[float, ...]": ("not {v}", "'[]'"),
}
#: The decode check added for a time field (:func:`is_time_field`): out of range or NaN goes to
#: the full decoder, which rejects it.
_FAST_TIME_CHECK = {
    "float": "if not -_MAX_S <= {v} <= _MAX_S: return None",
    "float | None": "if {v} is not None and not -_MAX_S <= {v} <= _MAX_S: return None",
}

#: The first bytes of every encoded Step (``kind`` first): where a reader tries :func:`decode_step_line`.
STEP_LINE_PREFIX = b'{"kind":"step",'


def _float(v: Any) -> float:
    t = type(v)
    if t is float:
        return v  # type: ignore[no-any-return]
    if t is int:
        return float(v)
    raise TypeError  # a string ("NaN"), a boolean, anything else: the full decoder's job


def _int(v: Any) -> str:
    if type(v) is not int:
        raise TypeError  # a bool, a NumPy integer: the generic encoder's job
    return int.__repr__(v)


def _fj(v: Any) -> str:
    """A float field as JSON writes it (``repr``; non-finite values as the strings ``_num`` gives)."""
    if type(v) is not float:
        raise TypeError  # an int, a NumPy float: the generic encoder's job
    if v - v == 0.0:  # finite
        return float.__repr__(v)
    return _DUMPS(_num(v))


#: JSON text of the strings a Step carries (its function's name): a handful per run.
_STR_JSON: dict[str, str] = {}


def _sj(v: Any) -> str:
    if type(v) is not str:
        raise TypeError
    text = _STR_JSON.get(v)
    if text is None:
        text = _DUMPS(v)
        if len(_STR_JSON) < 4096:
            _STR_JSON[v] = text
    return text


def _make_step_paths(cls: type[Message]) -> tuple[Callable[..., tuple[Any, ...]], Callable[[Any], dict[str, Any]],
                                                  Callable[[bytes], Any], Callable[[tuple[Any, ...]], bytes]]:
    """(step_values, _step_dict, decode_step_line, encode_step_values) for ``cls`` (``Step``; a
    test passes a Step with a field more)."""
    fields = dataclasses.fields(cls)  # their types as written (this module's annotations are text)
    names = [f.name for f in fields]
    defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
    kinds: dict[str, tuple[str, str, str]] = {}
    types = {f.name: str(f.type) for f in fields}
    for f in fields:
        if f.default_factory is not dataclasses.MISSING or str(f.type) not in _FAST_TYPES:
            raise TypeError(f"{cls.__name__}.{f.name}: {f.type} has no fast path (protocol._FAST_TYPES); "
                            f"give it one, or a plain default")
        to_json, check, write = _FAST_TYPES[str(f.type)]
        if is_time_field(f.name):
            if str(f.type) not in _FAST_TIME_CHECK:
                raise TypeError(f"{cls.__name__}.{f.name}: a time of type {f.type} has no fast check")
            check = f"{check}\n        {_FAST_TIME_CHECK[str(f.type)]}"
        kinds[f.name] = (to_json, check, write)
    params = ", ".join(n if n not in defaults else f"{n}=_defaults[{n!r}]" for n in names)
    values = "".join(f"{n}, " for n in names)
    encoded = ", ".join(f"{n!r}: {kinds[n][0].format(v='m.' + n)}" for n in names)
    reads = "\n".join(
        f"        {n} = o[{n!r}]" if n not in defaults else f"        {n} = o.get({n!r}, _defaults[{n!r}])"
        for n in names)
    checks = "\n".join(f"        {kinds[n][1].format(v=n)}" for n in names)
    # The line as the generic encoder writes it for these values, text joined in field order.
    template = ",".join(f'"{n}":%s' for n in names)
    pieces = ", ".join(kinds[n][2].format(v=n) for n in names)
    plain = " and ".join(_PLAIN_WRITE[types[n]][0].format(v=n) for n in names)
    plain_pieces = ", ".join(_PLAIN_WRITE[types[n]][1].format(v=n) for n in names)
    line = '{"kind":"' + cls.kind + '",' + template + '}' + chr(10)
    source = f"""
def step_values({params}):
    return ({values})

def _step_dict(m):
    return {{'kind': {cls.kind!r}, {encoded}}}

def decode_step_line(line):
    try:
        o = _loads(line)
{reads}
{checks}
        return _cls({", ".join(f"{n}={n}" for n in names)})
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None

def encode_step_values(values):
    try:
        {", ".join(names)}, = values
        if {plain}:
            return ({line!r} % ({plain_pieces},)).encode()
        return ({line!r} % ({pieces},)).encode()
    except (TypeError, ValueError):
        return encode(_cls(*values))
"""
    namespace: dict[str, Any] = {"_defaults": defaults, "_num": _num, "_float": _float, "_loads": json.loads,
                                 "_cls": cls, "_int": _int, "_fj": _fj, "_sj": _sj, "encode": encode,
                                 "_STR_JSON": _STR_JSON,
                                 "_MAX_S": MAX_SECONDS}
    exec(compile(source, "<tpuwatch.protocol Step paths>", "exec"), namespace)
    return (namespace["step_values"], namespace["_step_dict"], namespace["decode_step_line"],
            namespace["encode_step_values"])


step_values, _step_dict, decode_step_line, encode_step_values = _make_step_paths(Step)
encode_step_values.__doc__ = """``encode(Step(*values))``, byte for byte, from the values :func:`step_values` gives,
without building the Step or its dict (the agent's writer: ~4x cheaper a Step); values of other
types than the fields' own (a NumPy number, a bool) take the generic path."""
step_values.__doc__ = """A Step's values as a tuple in field order, taking ``Step``'s own parameters: what the
agent's training thread keeps (a tuple costs ~0.05 µs, a frozen Step ~1 µs); ``Step(*values)``
builds the message later, on the agent's thread."""
decode_step_line.__doc__ = """The Step of a well-formed, all-finite ``step`` line (bytes, no newline); ``None`` for
anything else (non-finite values, odd types, missing fields): use :func:`decode` then, which
validates and says what is wrong."""

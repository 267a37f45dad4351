"""The immutable view of a run that every consumer reads: the dashboard's panels, the headless
progress line, ``tpuwatch report``. Built by :class:`tpuwatch.monitor.state.RunState`.

Plain frozen dataclasses with units in the field names; no TensorFlow, no Textual.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping, Sequence

from tpuwatch import units
from tpuwatch.monitor.diagnostics.input_share import InputShare
from tpuwatch.monitor.ledger import Ledger
from tpuwatch.protocol import Finding, Pipeline, Retrace

#: "stopped": ended by a stop the user asked for (an interrupt, or a recorded stop request).
RunStatus = Literal["waiting", "starting", "running", "stalled", "finished", "stopped", "crashed", "lost"]
CommandStatus = Literal["pending", "queued", "running", "done", "failed"]


@dataclass(frozen=True)
class Baseline:
    """Whole-run figures of a finished run (None where it had none)."""

    run_id: str
    step_p50_s: float | None
    steps_per_s: float | None
    examples_per_s: float | None
    input_wait_share: float | None
    goodput: float | None = None  # its goodput ledger's (training at the ideal step / wall time)
    ledger_shares: Mapping[str, float] = field(default_factory=dict)  # bucket -> share of its wall time

    @property
    def label(self) -> str:
        """A short name: the run id's last part (``20250615-120000-train-ab12`` -> ``ab12``)."""
        return self.run_id.rsplit("-", 1)[-1] if self.run_id else "baseline"


@dataclass(frozen=True)
class StepPoint:
    """One point of the step history (possibly a downsampled bucket of several records)."""

    step: int
    t: float
    step_time_s: float
    input_wait_s: float | None
    loss: float | None
    loss_min: float | None = None  # over replicas
    loss_max: float | None = None


@dataclass(frozen=True)
class ReplicaLoss:
    index: int  # global replica index
    device: str
    worker: str
    loss: float  # last value (may be nan/inf)
    deviation: float  # loss - mean of finite replica losses at that step
    finite: bool
    step: int


@dataclass(frozen=True)
class FunctionTraces:
    name: str  # the function's own name: "multi_step_on_iterator" for training and evaluation
    traces: int
    instances: int
    last_change: str
    last_signature: str
    last_step: int | None
    t: float
    evaluation: bool = False  # an evaluation function: its traces are no retraces of training

    @property
    def label(self) -> str:
        """How views name it: "multi_step_on_iterator (evaluation)" apart from training's."""
        return units.function_label(self.name, self.evaluation)


def training_retraces(functions: Sequence[FunctionTraces]) -> int:
    """Traces beyond each training function's first (evaluation functions left out): the
    "retraces" figure of the headless line and the report."""
    return sum(max(0, f.traces - 1) for f in functions if not f.evaluation)


@dataclass(frozen=True)
class DeviceMemory:
    device: str
    worker: str
    current_bytes: int
    peak_bytes: int
    limit_bytes: int | None
    source: str
    limit_source: str
    duty_cycle_pct: float | None
    t: float


@dataclass(frozen=True)
class HostMemory:
    worker: str
    rss_bytes: int
    available_bytes: int
    total_bytes: int
    cpu_percent: float
    t: float
    load_1m: float | None = None  # the host's 1-minute load average (older recordings: None)


@dataclass(frozen=True)
class HostPoint:
    """One host sample of the history the Memory panel charts (RSS, process CPU%, load)."""

    t: float
    rss_bytes: int
    cpu_percent: float
    load_1m: float | None


@dataclass(frozen=True)
class LogEntry:
    t: float
    level: str  # debug | info | warning | error
    source: str
    message: str
    worker: str = ""  # the agent that reported it ("" when the run has one)


@dataclass(frozen=True)
class CommandView:
    id: str
    action: str
    status: CommandStatus
    message: str
    details: Mapping[str, object]
    t: float  # time of the last change


@dataclass(frozen=True)
class WorkerView:
    """One agent process (one host in a multi-worker job)."""

    name: str
    host: str
    pid: int
    status: RunStatus
    step: int
    last_step_t: float | None
    step_p50_s: float | None
    input_wait_frac: float | None  # the input-bound rule's figure for this worker
    rss_bytes: int | None
    connected: bool
    exit_code: int | None = None
    exit_signal: int | None = None
    input_scope: str = ""  # "over the last 30 s" / "over the whole run"
    summary: bool = False  # its newest step came in a summary (the summary stream), not a record


@dataclass(frozen=True)
class RunSnapshot:
    # identity
    run_id: str = ""
    script: str = ""
    argv: tuple[str, ...] = ()
    host: str = ""
    pid: int | None = None
    tf_version: str = ""
    keras_version: str = ""
    # topology and configuration
    strategy: str = ""  # the strategy that ran the most training steps
    strategies: tuple[tuple[str, int, int], ...] = ()  # every strategy used: (name, replicas, steps)
    replicas: int | None = None
    device_kind: str = ""
    devices: tuple[str, ...] = ()
    is_tpu: bool = False
    num_workers: int = 1
    mixed_precision: str | None = None
    global_batch_size: int | None = None
    per_replica_batch_size: int | None = None
    steps_per_execution: int | None = None
    total_steps: int | None = None
    epochs: int | None = None
    # lifecycle
    status: RunStatus = "waiting"
    exit_code: int | None = None
    exit_signal: int | None = None
    exception: str | None = None  # "Type: message"
    exception_traceback: str = ""
    lost_reason: str | None = None  # why the launcher declared the run lost
    started_t: float | None = None  # the launch (the first 'starting' phase's since), else the first hello
    ended_t: float | None = None  # the exit record (or the last message of a lost run)
    now: float = 0.0  # the time this snapshot describes
    last_message_t: float | None = None  # newest message time (use as ``now`` in a replay)
    # progress and speed
    step: int = 0
    epoch: int | None = None
    #: Keras' logs at the end of each epoch (val_loss, metrics, learning_rate), oldest first, bounded.
    epoch_logs: tuple[tuple[int, Mapping[str, object]], ...] = ()
    last_step_t: float | None = None
    step_time_s: float | None = None  # last record
    step_p50_s: float | None = None  # rolling window: the last ``step_window`` records
    step_p95_s: float | None = None
    step_window: int = 0
    steps_per_s: float | None = None
    examples_per_s: float | None = None
    eta_s: float | None = None
    #: Input wait, by the one definition in ``tpuwatch.monitor.diagnostics.input_share`` and
    #: from its one computation (the findings' own numbers; None before their first evaluation).
    #: ``input_wait`` is what the ``input-bound`` rule judges now, ``input_scope`` says over
    #: what ("over the last 30 s" while running, "over the whole run" once ended);
    #: ``input_wait_frac`` is its share. ``input_recent`` / ``input_run``: the two scopes.
    input_wait: InputShare | None = None
    input_scope: str = ""
    input_wait_frac: float | None = None
    input_wait_frac_total: float | None = None  # input_run's share
    input_recent: InputShare | None = None
    input_run: InputShare | None = None
    #: A finished run to show deltas against (``tpuwatch run --baseline RUN``).
    baseline: Baseline | None = None
    steps_total: int = 0  # training steps recorded (sum over step records)
    # losses
    loss: float | None = None
    # The step the loss belongs to: older than ``step`` when the latest steps carried none (a
    # loop whose loss the agent cannot see, or losses sampled less often than steps).
    loss_step: int | None = None
    replica_losses: tuple[ReplicaLoss, ...] = ()
    history: tuple[StepPoint, ...] = ()  # bounded, downsampled, oldest first
    history_records_per_point: int = 1  # step records merged into each history point
    # functions, memory
    functions: tuple[FunctionTraces, ...] = ()
    retraces: tuple[Retrace, ...] = ()  # every trace in order, bounded (the newest kept)
    #: The input pipelines the training iterates (the map: each stage, its line and settings),
    #: in the order first iterated, bounded: (worker, message).
    pipelines: tuple[tuple[str, Pipeline], ...] = ()
    device_memory: tuple[DeviceMemory, ...] = ()
    device_peaks: tuple[tuple[str, str, int], ...] = ()  # (worker, device, peak bytes) over the run
    host_memory: tuple[HostMemory, ...] = ()
    host_rss_peak_bytes: int | None = None  # largest RSS sampled on any worker
    tpu_metrics_note: str = ""  # why TPU runtime metrics are absent, when they are
    #: What the primary worker's process is doing (the agent's last ``Phase``; "" before any),
    #: since when (unix), and on what ("test_step", "CheckpointManager.save").
    phase: str = ""
    phase_since: float | None = None
    phase_detail: str = ""
    #: Where the wall time went, launch to exit (to ``now`` while live), merged over workers.
    ledger: Ledger | None = None
    # the latest host samples of the first worker that sends them, oldest first (bounded)
    host_history: tuple[HostPoint, ...] = ()
    # "DEVICE: why" for each device whose memory the agent cannot read (a CPU host's allocator)
    device_memory_notes: tuple[str, ...] = ()
    # events, commands, findings
    events: tuple[LogEntry, ...] = ()  # most recent last, bounded
    commands: tuple[CommandView, ...] = ()
    findings: tuple[Finding, ...] = ()
    workers: tuple[WorkerView, ...] = ()
    disabled_probes: Mapping[str, str] = field(default_factory=dict)
    # recording health
    messages: int = 0
    malformed: int = 0
    unknown: int = 0
    truncated_tail: bool = False
    recording_gaps: tuple[str, ...] = ()  # what the recording may be missing, one line each
    # set by a live viewer (not the recording): the disk under the run directory is full
    disk_full: str = ""
    # set by a viewer: it is still reading a backlog (a re-attach, a long recording), so the
    # step shown is where the reading is, not where the run is
    catching_up: bool = False


def mean_loss(values: Sequence[float]) -> float | None:
    """The one mean of losses (replicas, workers): a plain mean, so a non-finite value makes it
    non-finite, as ``strategy.reduce(MEAN)`` and the script's own print do (the agent's
    ``Step.loss`` is the same mean). None for no values. Where a non-finite replica must not
    hide the others (the deviation of each replica), the caller averages the finite ones and
    says so."""
    if not values:
        return None
    return sum(values) / len(values)


#: What the loss tpuwatch shows is: the mean over replicas of the last step read.
LAST_STEP = "last step"


def keras_logged_loss_note(keras_version: str, replicas: int | None) -> str:
    """Why Keras' logged loss may not be the replicas' mean: "" when it is."""
    if not replicas or replicas < 2 or not keras_version[:2] == "3.":
        return ""
    try:
        minor = int(keras_version.split(".")[1])
    except (IndexError, ValueError):
        return ""
    if minor <= 2:
        return f"Keras {keras_version} logs the sum over replicas"
    if minor <= 6:
        return f"Keras {keras_version} logs replica 0's loss"
    return ""


@dataclass(frozen=True)
class KerasLoss:
    """Keras' own logged loss at the end of an epoch (its running mean over the epoch)."""

    epoch: int  # 0-based
    loss: float
    note: str  # keras_logged_loss_note: "" when it is the replicas' mean

    def describe(self) -> str:
        """``Keras epoch 2 mean 0.3277 (Keras 3.5.0 logs replica 0's loss)``."""
        return (f"Keras epoch {self.epoch + 1} mean {units.keras_value(self.loss)}"
                + (f" ({self.note})" if self.note else ""))


def keras_loss(s: RunSnapshot) -> KerasLoss | None:
    """Keras' logged loss at the last epoch end (None outside ``fit`` or before an epoch ended)."""
    for epoch, logs in reversed(s.epoch_logs):
        v = logs.get("loss")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return KerasLoss(epoch, float(v), keras_logged_loss_note(s.keras_version, s.replicas))
    return None


def worker_exit_codes(snap: RunSnapshot) -> dict[str, int]:
    """Each ended worker's exit code."""
    return {w.name: w.exit_code for w in snap.workers if w.exit_code is not None}


def worker_status_text(snap: RunSnapshot, name: str, status: str, connected: bool = True,
                       codes: dict[str, int] | None = None) -> str:
    """``crashed (exit 137)``, ``lost``, ``disconnected``, ``running``: what one worker is doing."""
    codes = worker_exit_codes(snap) if codes is None else codes
    if status in ("crashed", "stopped", "finished") and name in codes:
        return f"{status} (exit {codes[name]})"
    if not connected and status not in ("finished", "stopped", "crashed", "lost"):
        return "disconnected"
    return status

"""The immutable view of a run that every consumer reads: the dashboard's panels, the headless
progress line, ``tpuwatch report``. Built by :class:`tpuwatch.monitor.state.RunState`.

Plain frozen dataclasses with units in the field names; no TensorFlow, no Textual.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping

from tpuwatch.monitor.diagnostics.input_share import InputShare
from tpuwatch.protocol import Finding, Pipeline, Retrace

#: "stopped": ended by a stop the user asked for (an interrupt, or a recorded stop request).
RunStatus = Literal["waiting", "starting", "running", "stalled", "finished", "stopped", "crashed", "lost"]
CommandStatus = Literal["pending", "queued", "running", "done", "failed"]


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
    name: str
    traces: int
    instances: int
    last_change: str
    last_signature: str
    last_step: int | None
    t: float


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
    input_wait_frac: float | None
    rss_bytes: int | None
    connected: bool
    exit_code: int | None = None
    exit_signal: int | None = None


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
    started_t: float | None = None  # the first hello
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
    step_p50_s: float | None = None  # rolling window
    step_p95_s: float | None = None
    steps_per_s: float | None = None
    examples_per_s: float | None = None
    eta_s: float | None = None
    #: Share of step time waiting for input, by the one definition in
    #: ``tpuwatch.monitor.diagnostics.input_share`` (the findings' own numbers): over the latest
    #: window of eligible steps, and over the whole run. Before the first evaluation of the
    #: findings, the plain rolling share of the latest records.
    input_wait_frac: float | None = None
    input_wait_frac_total: float | None = None
    input_recent: InputShare | None = None  # the verdict's evidence (None before the first evaluation)
    input_run: InputShare | None = None
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
    host_rss_history: tuple[tuple[float, int], ...] = ()  # (t, rss_bytes), bounded
    tpu_metrics_note: str = ""  # why TPU runtime metrics are absent, when they are
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

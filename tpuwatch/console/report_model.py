"""The report of one run as typed values: built once from a snapshot
(:func:`tpuwatch.console.report.build_model`); the JSON form is :meth:`Report.as_json`, whose keys
are these fields' names, in this order (``tests/monitor/test_report_golden.py`` pins the bytes).

Numbers are as the run gave them (a NaN stays a float here); :meth:`Report.as_json` writes the
non-finite ones as the strings "NaN"/"Infinity", as on the wire. The pipeline map and the goodput
ledger are still plain mappings inside the model (their shapes are the monitor's).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


def json_safe(v: Any) -> Any:
    """``v`` with its non-finite floats as "NaN"/"Infinity"/"-Infinity", tuples as lists and
    mapping keys as strings: what ``json.dumps(..., allow_nan=False)`` takes."""
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


@dataclass(frozen=True)
class StrategyUse:
    """A distribution strategy the run used, and how many training steps ran under it."""

    strategy: str
    replicas: int
    training_steps: int


@dataclass(frozen=True)
class RunInfo:
    """What ran, where, and how it ended (unix seconds; ``duration_s`` from start to end)."""

    id: str
    dir: str
    script: str
    argv: list[str]
    host: str
    status: str
    strategy: str
    strategies: list[StrategyUse]
    replicas: int | None
    device_kind: str
    devices: list[str]
    num_workers: int
    tf_version: str
    keras_version: str
    mixed_precision: str | None
    global_batch_size: int | None
    start: float | None
    end: float | None
    duration_s: float | None
    exit_code: int | None
    exit_signal: int | None
    exception: str | None
    traceback: str
    lost_reason: str | None


@dataclass(frozen=True)
class InputWait:
    """The input-bound rule's own figures over every eligible step."""

    share: float
    wait_per_step_s: float
    step_time_s: float
    steps: int
    verdict: str


@dataclass(frozen=True)
class KerasEpochLoss:
    """The loss of the last epoch as Keras printed it (``epoch`` counted from 1)."""

    epoch: int
    loss: float
    note: str


@dataclass(frozen=True)
class Retraces:
    """One traced function: its own name (``evaluation`` says whether it is an evaluation's)."""

    name: str
    traces: int
    instances: int
    last_change: str
    last_step: int | None
    evaluation: bool


@dataclass(frozen=True)
class DevicePeak:
    worker: str
    device: str
    peak_bytes: int
    limit_bytes: int | None


@dataclass(frozen=True)
class Memory:
    devices: list[DevicePeak]
    host_rss_peak_bytes: int | None
    tpu_metrics_note: str  # why libtpu's HBM/duty cycle are absent


@dataclass(frozen=True)
class ReplicaLoss:
    index: int
    device: str
    worker: str
    loss: float  # may be NaN or infinite (``finite`` says)
    deviation: float
    finite: bool
    step: int | None


@dataclass(frozen=True)
class CommandDone:
    """A command sent to the run, how it ended (``t``: unix seconds)."""

    id: str
    action: str
    status: str
    message: str
    details: dict[str, Any]
    t: float | None


@dataclass(frozen=True)
class Summary:
    """The run's figures: steps, speed (after the first step), input wait, loss, memory, and
    the health of its recording."""

    steps: int
    step_records: int
    total_steps: int | None
    step_time_p50_s: float | None
    step_time_p95_s: float | None
    steps_per_s: float | None
    examples_per_s: float | None
    input_wait_share: float | None
    input_wait: InputWait | None
    last_loss: float | None  # the mean over replicas of the last step read
    keras_epoch_loss: KerasEpochLoss | None
    retraces: list[Retraces]
    memory: Memory
    replica_losses: list[ReplicaLoss]
    commands: list[CommandDone]
    truncated_tail: bool
    recording_gaps: list[str]
    dropped_bytes: int
    malformed_lines: int
    unknown_lines: int
    messages: int
    disabled_probes: dict[str, str]


@dataclass(frozen=True)
class FindingRow:
    """A finding as reported (``t``: unix seconds of the verdict)."""

    rule: str
    severity: str
    message: str
    evidence: dict[str, Any]
    advice: str
    first_step: int | None
    last_step: int | None
    worker: str
    t: float


@dataclass(frozen=True)
class WorkerRow:
    """One worker of a group run: its end, steps, step time, input wait, memory."""

    name: str
    index: int
    dir: str
    host: str
    pid: int | None
    status: str
    exit_code: int | None
    stopped: bool
    steps: int
    step_time_p50_s: float | None
    input_wait_share: float | None
    rss_bytes: int | None
    replicas: list[int]


@dataclass(frozen=True)
class Report:
    """The whole report; ``workers`` only for a group run (absent from the JSON otherwise)."""

    run: RunInfo
    summary: Summary
    pipelines: list[dict[str, Any]]
    findings: list[FindingRow]
    ledger: dict[str, Any] | None
    workers: list[WorkerRow] | None = field(default=None)

    def as_json(self) -> dict[str, Any]:
        """The JSON form: these fields' names as keys, non-finite numbers as strings."""
        out = asdict(self)
        if self.workers is None:
            del out["workers"]
        safe: dict[str, Any] = json_safe(out)
        return safe

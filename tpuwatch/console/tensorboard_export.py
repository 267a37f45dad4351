"""``--tensorboard LOGDIR``: tpuwatch's series as TensorBoard scalars (docs/tensorboard.md).

Written with TensorBoard's own event writer (``tensorboard.summary.writer.event_file_writer``)
and protos, never TensorFlow: the viewer does not import it. The scalars go into a run folder of
their own, ``LOGDIR/tpuwatch-<run-id>`` (one sub-folder per worker for a ``--workers`` run), so
``tensorboard --logdir LOGDIR`` shows them beside the script's own logs. Each point is at the
script's global step, with the wall time of its record.

Needs the ``tensorboard`` package (``pip install 'tpuwatch[tensorboard]'``; TensorFlow up to 2.19
brings it along).
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from tpuwatch import units
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.protocol import DeviceSample, Finding, Hello, HostSample, Message, Step, StepLoss

if TYPE_CHECKING:
    from tpuwatch.sources.source import RecordingSource

MISSING = "needs the tensorboard package: pip install 'tpuwatch[tensorboard]' (or pip install tensorboard)"
#: The series and their tags (a replica's loss and a device's memory carry its index or name).
STEP_TIME = "tpuwatch/step_time_seconds"
INPUT_WAIT = "tpuwatch/input_wait_seconds"
LOSS = "tpuwatch/loss"  # the mean over the worker's replicas
REPLICA_LOSS = "tpuwatch/replica_loss/{index}"
HOST_RSS = "tpuwatch/host_rss_bytes"
DEVICE_MEMORY = "tpuwatch/device_memory_bytes/{device}"
#: Seconds between two flushes of a live run's events to disk.
FLUSH_S = 5


def folder(logdir: Path, run_id: str) -> Path:
    """The run folder tpuwatch writes into under ``logdir``."""
    return Path(logdir) / f"tpuwatch-{run_id}"


def problem(logdir: Path, run_id: str | None) -> str:
    """What stops an export into ``logdir`` ("" when nothing does), one line. ``run_id`` None:
    the run is yet to start (its folder cannot exist yet)."""
    try:
        _writer_class()
    except ImportError:
        return f"--tensorboard {MISSING}"
    if str(logdir).startswith(("gs:/", "s3:/")):  # a Path has made gs:// into gs:/
        return (f"--tensorboard {logdir}: give a local directory (TensorBoard reads it with --logdir; copy it "
                "to a bucket after)")
    target = folder(logdir, run_id or "")
    if run_id is not None and target.exists() and any(target.rglob("events.out.tfevents.*")):
        return f"--tensorboard: {target} already holds tpuwatch's scalars for this run; remove it or give another LOGDIR"
    if Path(logdir).exists() and not Path(logdir).is_dir():
        return f"--tensorboard {logdir}: not a directory"
    return ""


def _writer_class() -> Any:
    # TensorBoard's own switch to its TensorFlow stub (//tensorboard/compat:no_tensorflow): without
    # it the writer's first file call imports TensorFlow whenever it is installed.
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    return EventFileWriter


def _tag_part(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", text).strip("_") or "_"


class TensorBoardExport:
    """An outlet of a :class:`~tpuwatch.console.relay.Relay` (and of :func:`export`) writing
    every step record's step time, input wait and losses, and every memory sample, as scalars.

    ``per_worker``: one sub-folder per worker (a multi-worker run).
    """

    def __init__(self, logdir: Path, run_id: str, *, per_worker: bool = False, flush_s: float = FLUSH_S) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2
        self._writer_cls = _writer_class()
        self.folder = folder(logdir, run_id)
        self.per_worker = per_worker
        self.flush_s = flush_s
        self._writers: dict[str, Any] = {}
        self._step: dict[str, int] = {}  # each worker's latest global step (memory samples are put there)
        self.points: dict[str, int] = {}  # tag -> scalars written

    def _write(self, worker: str, step: int, wall_time: float, values: Sequence[tuple[str, float]]) -> None:
        """One event holding ``values`` (tag, value) at ``step`` (one event per record: TensorBoard's
        stub checksums every byte in Python, so fewer, fuller events cost less)."""
        if not values:
            return
        key = worker if self.per_worker else ""
        writer = self._writers.get(key)
        if writer is None:
            path = self.folder / _tag_part(worker) if self.per_worker else self.folder
            writer = self._writer_cls(str(path), flush_secs=self.flush_s, filename_suffix=".tpuwatch")
            self._writers[key] = writer
        Value = self._summary_pb2.Summary.Value
        summary = self._summary_pb2.Summary(value=[Value(tag=tag, simple_value=v) for tag, v in values])
        writer.add_event(self._event_pb2.Event(wall_time=wall_time, step=step, summary=summary))
        for tag, _ in values:
            self.points[tag] = self.points.get(tag, 0) + 1

    @staticmethod
    def _losses(loss: float | None, replicas: Sequence[float]) -> list[tuple[str, float]]:
        out = [(LOSS, loss)] if loss is not None else []
        return out + [(REPLICA_LOSS.format(index=i), v) for i, v in enumerate(replicas)]

    # --- Outlet ----------------------------------------------------------------------------------

    def take(self, worker: str, msg: Message) -> None:
        if isinstance(msg, Step):
            self._step[worker] = msg.step
            values = [(STEP_TIME, msg.step_time_s)]
            if msg.input_wait_s is not None:
                values.append((INPUT_WAIT, msg.input_wait_s))
            self._write(worker, msg.step, msg.t, values + self._losses(msg.loss, msg.replica_losses))
        elif isinstance(msg, StepLoss):
            self._write(worker, msg.step, msg.t, self._losses(msg.loss, msg.replica_losses))
        elif isinstance(msg, HostSample):
            self._write(worker, self._step.get(worker, 0), msg.t, [(HOST_RSS, msg.rss_bytes)])
        elif isinstance(msg, DeviceSample):
            tag = DEVICE_MEMORY.format(device=_tag_part(units.device_name(msg.device)))
            self._write(worker, self._step.get(worker, 0), msg.t, [(tag, msg.current_bytes)])

    def update(self, snap: RunSnapshot, new_findings: Sequence[Finding]) -> None:
        pass  # the writers flush every flush_s on their own threads

    def close(self, snap: RunSnapshot | None = None, new_findings: Sequence[Finding] = ()) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


def export(source: "RecordingSource", logdir: Path, run_id: str, *, per_worker: bool) -> TensorBoardExport:
    """Writes a finished (or still growing) recording's series under ``logdir``; returns the
    export (its ``folder`` and ``points``)."""
    out = TensorBoardExport(logdir, run_id, per_worker=per_worker)
    hello_worker = ""
    try:
        while True:
            batch = source.poll_tagged()
            if not batch and source.caught_up:
                break
            for worker, msg in batch:
                if worker is None and isinstance(msg, Hello):
                    hello_worker = msg.worker
                out.take(worker if worker is not None else hello_worker, msg)
        for worker, msg in source.finish():
            out.take(worker if worker is not None else hello_worker, msg)
    finally:
        out.close()
        source.close()
    return out

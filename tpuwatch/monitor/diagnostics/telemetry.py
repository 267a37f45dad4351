"""What the rules read: per-worker bounded windows and run-wide facts, built from messages.

:class:`Telemetry` is updated by the engine for every message (``Step`` on the fast path: a few
attribute writes and one ``deque.append``); rules read it and keep only their own verdicts.
Every container is bounded, so memory does not grow with the length of the run.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field

from tpuwatch.protocol import (
    AllocationSites,
    Config,
    DeviceSample,
    Epoch,
    Exit,
    HostSample,
    HostSummary,
    InputStages,
    Phase,
    Pipeline,
    Step,
    Topology,
)

from .input_share import InputShare, InputTotals, recent_share
from .thresholds import Thresholds

#: One eligible step record in a window:
#: (step, t, step_time_s, input_wait_s or None, steps, function name).
Rec = tuple[int, float, float, "float | None", int, str]

#: The scope of a figure over every eligible step of a run (the words shown beside it).
WHOLE_RUN = "over the whole run"

_MAX_EXAMPLE_SIZES = 16  # distinct Step.examples values remembered (batch sizes seen)
_MAX_FIRST_FUNCTIONS = 16  # step functions whose first step times are kept (trend baselines)
_MAX_BYTES = 1 << 60  # byte counts beyond this are corrupt: ignored, never a crash
_MAX_PIPELINES = 8
_MAX_HOLDERS = 32  # pipeline stages holding host memory remembered per worker


@dataclass
class DevicePeak:
    device: str
    peak_bytes: int
    limit_bytes: int | None
    source: str
    limit_source: str
    t: float


@dataclass
class WorkerTelemetry:
    """One agent process, keyed by the ``worker`` name given to ``Engine.apply``."""

    name: str
    th: Thresholds
    topology: Topology | None = None
    records: int = 0  # Step messages seen
    last_step: int = 0  # highest step number seen
    last_step_t: float | None = None
    first_step_t: float | None = None
    #: Eligible records only (warm-up and boundary records left out).
    window: deque[Rec] = field(default_factory=deque)
    eligible: int = 0  # eligible records ever (the window keeps the latest)
    skip_left: int = 0
    #: Wall time between consecutive step records: the stall baseline.
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=101))
    # liveness
    last_alive_t: float | None = None  # latest t of any message from this worker
    samples_seen: bool = False  # the agent's sampler thread reports, so silence means no steps
    exit: Exit | None = None
    exception_seen: bool = False
    # epochs
    epoch: int | None = None
    boundary_since_step: bool = False  # an Epoch message arrived after the last step record
    epoch_end_steps: list[int] = field(default_factory=list)  # first few only
    first_epoch_end_t: float | None = None
    epoch_begin_seen: bool = False
    longest_boundary_gap_s: float = 0.0
    # phases (the agent's Phase messages): the time since the last step that no phase explains.
    #: The agent's current phase ("" before any Phase message: an older agent).
    phase: str = ""
    phase_since: float | None = None
    #: Start of the current stretch with nothing progressing (None: in a save, a new iterator or
    #: a trace, which count as progress while they last).
    quiet_since: float | None = None
    #: Longest stretch with nothing progressing since the last step record.
    longest_quiet_s: float = 0.0
    longest_quiet_at: float | None = None  # where that stretch began
    # host memory: one point per bucket (latest RSS in it), bounded
    #: (t, rss_bytes, untraced_bytes): ``untraced_bytes`` leaves out the growth between two
    #: samples with a tf.function trace between them (traced graphs, the retrace finding's).
    rss_points: deque[tuple[float, int, int]] = field(default_factory=deque)
    rss_first_t: float | None = None
    rss_bucket_start_t: float = -math.inf
    #: (step, t, rss_bytes, untraced_bytes) at host samples taken after a new step, bounded by
    #: thinning.
    rss_step_points: list[tuple[int, float, int, int]] = field(default_factory=list)
    traces_since_sample: int = 0  # traces since the latest host sample
    rss_last: int | None = None
    rss_untraced: int = 0
    #: Host memory that grew between two samples with a trace between them (traced graphs):
    #: (bytes, intervals), the retrace finding's evidence.
    traced_growth_bytes: int = 0
    traced_growth_intervals: int = 0
    #: Stages of the iterated pipelines that hold data in host memory: (stage, site, bytes);
    #: bytes -1 when unknown (an in-memory cache of a dataset whose size is not static).
    memory_holders: list[tuple[str, str, int]] = field(default_factory=list)
    #: The leak doctor's latest window: where Python allocations grew.
    allocations: AllocationSites | None = None
    #: The latest auto-profile's tf.data iterator self times (which stage the wait comes from).
    input_stages: InputStages | None = None
    #: An automatic profile capture is under way: its steps carry the profiler's overhead and are
    #: left out of the figures (like the records after a retrace), never out of the step count.
    capturing: bool = False
    #: The pipelines this worker iterates, in the order it first did (the first few).
    pipelines: list[Pipeline] = field(default_factory=list)
    available_bytes: int | None = None
    total_bytes: int | None = None
    devices: dict[str, DevicePeak] = field(default_factory=dict)
    examples: Counter[int] = field(default_factory=Counter)
    #: Input wait over every eligible record of the run (the whole-run verdict).
    input_totals: InputTotals = field(default_factory=InputTotals)
    #: Step times of the first ``jitter_min_records`` eligible records per step function: the
    #: rising-trend baseline, the same whenever the rules are checked (live or a report).
    first_times: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.window = deque(maxlen=self.th.window_records)
        self.rss_points = deque(maxlen=self.th.rss_window_points)
        self.skip_left = self.th.warmup_records

    # --- updates (called by the engine) ------------------------------------------------------

    def on_step(self, m: Step) -> None:
        self.records += 1
        prev_t = self.last_step_t
        if prev_t is not None:
            gap = m.t - prev_t
            if gap > 0:
                self.intervals.append(gap)
                if self.boundary_since_step and gap > self.longest_boundary_gap_s:
                    self.longest_boundary_gap_s = gap
        else:
            self.first_step_t = m.t
        if m.step > self.last_step:
            self.last_step = m.step
        self.last_step_t = m.t
        self.quiet_since = m.t
        self.longest_quiet_s = 0.0
        self.longest_quiet_at = None
        if m.t > (self.last_alive_t or 0.0):
            self.last_alive_t = m.t
        if m.epoch is not None and m.epoch != self.epoch:
            if self.epoch is not None:
                self.skip_left = max(self.skip_left, self.th.boundary_skip_records)
            self.epoch = m.epoch
        if self.boundary_since_step:
            self.boundary_since_step = False
        if m.examples is not None and (m.examples in self.examples
                                       or len(self.examples) < _MAX_EXAMPLE_SIZES):
            self.examples[m.examples] += 1
        if self.skip_left > 0:
            self.skip_left -= 1
            return
        if self.capturing:
            return
        st = m.step_time_s
        if not (st > 0 and math.isfinite(st)):
            return
        wait = m.input_wait_s
        if wait is not None and not math.isfinite(wait):
            wait = None
        k = m.steps if m.steps > 0 else 1
        if wait is not None:
            self.input_totals.add(m.step, st, wait, k)
        self.window.append((m.step, m.t, st, wait, k, m.function))
        self.eligible += 1
        first = self.first_times.get(m.function)
        if first is None:
            if len(self.first_times) < _MAX_FIRST_FUNCTIONS:
                self.first_times[m.function] = [st]
        elif len(first) < self.th.jitter_min_records:
            first.append(st)

    def on_summary(self, m: HostSummary) -> None:
        """A host's summary (the summary stream): its interval becomes one window record of
        ``m.steps`` steps with the interval's mean step time and input wait, so shares (sums of
        waits over sums of times) are the records' own; medians are over intervals. No step
        intervals are taken from it (a summary's cadence is not the steps')."""
        if m.step is None or m.step_t is None:
            return
        self.records += m.records
        if self.last_step_t is None:
            self.first_step_t = m.step_t
        if m.step > self.last_step:
            self.last_step = m.step
        if self.last_step_t is None or m.step_t > self.last_step_t:
            self.last_step_t = m.step_t
            self.quiet_since = m.step_t
            self.longest_quiet_s = 0.0
            self.longest_quiet_at = None
        if m.step_t > (self.last_alive_t or 0.0):
            self.last_alive_t = m.step_t
        if m.epoch is not None:
            self.epoch = m.epoch
        if self.skip_left >= m.records:  # an interval of warm-up records only
            self.skip_left -= m.records
            return
        self.skip_left = 0
        if m.steps <= 0 or not (m.step_time_sum_s > 0 and math.isfinite(m.step_time_sum_s)):
            return
        st = m.step_time_sum_s / m.steps
        wait = m.input_wait_sum_s / m.input_wait_steps if m.input_wait_steps else None
        if wait is not None and not math.isfinite(wait):
            wait = None
        if wait is not None:
            self.input_totals.add(m.step, st, wait, m.steps)
        self.window.append((m.step, m.step_t, st, wait, m.steps, m.function))
        self.eligible += 1

    def on_phase(self, m: Phase) -> None:
        """Evaluations progress by their calls; saves, new iterators and traces while they last;
        anything else (host time, training between steps) is quiet until the next step."""
        new = m.phase != self.phase or m.since != self.phase_since
        self.phase, self.phase_since = m.phase, m.since
        if m.phase in ("checkpointing", "iterator", "compiling", "evaluating"):
            at = m.since if new else m.t
            self._close_quiet(at)
            # an evaluation is quiet again until its next progress report
            self.quiet_since = m.t if m.phase == "evaluating" else None
        elif self.quiet_since is None:
            self.quiet_since = max(m.since, self.last_step_t or m.since)

    def on_trace_begun(self, t: float) -> None:
        """A trace began (a Retrace): tracing and compiling progress for up to
        ``stall_boundary_min_s`` (an XLA compile can take minutes); a step that still has not
        come after that is quiet from then on."""
        self._close_quiet(t)
        self.quiet_since = t + self.th.stall_boundary_min_s

    def _close_quiet(self, at: float) -> None:
        if self.quiet_since is not None and at - self.quiet_since > self.longest_quiet_s:
            self.longest_quiet_s = at - self.quiet_since
            self.longest_quiet_at = self.quiet_since

    def quiet_s(self, end: float) -> float:
        """Longest stretch since the last step record, up to ``end``, with nothing progressing."""
        return self.quiet_span(end)[1]

    def quiet_span(self, end: float) -> tuple[float, float]:
        """(start, seconds) of the longest stretch since the last step record, up to ``end``,
        with nothing progressing."""
        current = end - self.quiet_since if self.quiet_since is not None else 0.0
        if current > self.longest_quiet_s and self.quiet_since is not None:
            return self.quiet_since, current
        start = self.longest_quiet_at if self.longest_quiet_at is not None else (self.last_step_t or end)
        return start, max(self.longest_quiet_s, 0.0)

    def on_retrace(self, t: float | None = None) -> None:
        if t is not None and self.last_step_t is not None:
            self.on_trace_begun(t)
        # the step that traced (and the one after) compiled: not steady state
        self.skip_left = max(self.skip_left, self.th.boundary_skip_records)
        self.traces_since_sample += 1

    def on_pipeline(self, m: Pipeline) -> None:
        if len(self.pipelines) < _MAX_PIPELINES:
            self.pipelines.append(m)
        for stage, site, held in zip(m.stages, m.sites, m.holds_bytes):
            if held and len(self.memory_holders) < _MAX_HOLDERS:
                self.memory_holders.append((stage, site, held))

    def on_epoch(self, m: Epoch) -> None:
        self.boundary_since_step = True
        self.skip_left = max(self.skip_left, self.th.boundary_skip_records)
        if m.phase == "begin":
            self.epoch_begin_seen = True
        elif m.phase == "end":
            if self.first_epoch_end_t is None:
                self.first_epoch_end_t = m.t
            if m.step is not None and len(self.epoch_end_steps) < 4:
                self.epoch_end_steps.append(m.step)

    def on_host(self, m: HostSample) -> None:
        self.samples_seen = True
        if not (0 <= m.rss_bytes < _MAX_BYTES and 0 <= m.available_bytes < _MAX_BYTES):
            return
        self.available_bytes = m.available_bytes
        self.total_bytes = m.total_bytes
        if self.rss_first_t is None:
            self.rss_first_t = m.t
        traced, self.traces_since_sample = self.traces_since_sample, 0
        grown = m.rss_bytes - self.rss_last if self.rss_last is not None else 0
        self.rss_last = m.rss_bytes
        if traced and grown > 0:
            self.traced_growth_bytes += grown
            self.traced_growth_intervals += 1
        else:
            self.rss_untraced += grown
        untraced = self.rss_untraced
        if self.rss_points and m.t - self.rss_bucket_start_t < self.th.rss_bucket_s:
            self.rss_points[-1] = (m.t, m.rss_bytes, untraced)  # same bucket: keep its latest sample
        else:
            self.rss_bucket_start_t = m.t
            self.rss_points.append((m.t, m.rss_bytes, untraced))
        if self.last_step > 0:
            pts = self.rss_step_points
            if pts and pts[-1][0] == self.last_step:
                pts[-1] = (self.last_step, m.t, m.rss_bytes, untraced)
            else:
                if len(pts) >= self.th.rss_step_points:
                    del pts[1::2]  # keep every other point: the fit needs the shape, not all
                pts.append((self.last_step, m.t, m.rss_bytes, untraced))

    def on_device(self, m: DeviceSample) -> None:
        self.samples_seen = True
        if not all(0 <= b < _MAX_BYTES for b in (m.current_bytes, m.peak_bytes, m.limit_bytes or 0)):
            return
        old = self.devices.get(m.device)
        peak = max(m.peak_bytes, m.current_bytes, old.peak_bytes if old else 0)
        limit = m.limit_bytes if m.limit_bytes else (old.limit_bytes if old else None)
        lsrc = m.limit_source if m.limit_bytes else (old.limit_source if old else "")
        self.devices[m.device] = DevicePeak(m.device, peak, limit, m.source, lsrc, m.t)

    # --- derived -------------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        return self.exit is not None or self.exception_seen

    def input_share(self) -> tuple[InputShare | None, str]:
        """This worker's input wait as the ``input-bound`` rule judges it, with its scope in
        words: the latest window while the worker runs, every eligible step once it has ended."""
        if self.ended:
            return self.input_totals.share(self.th), WHOLE_RUN
        return recent_share(self.window, self.th)

    def replica_offset(self) -> int:
        """Global index of this worker's first replica (0 without a topology)."""
        topo = self.topology
        return topo.worker_index * topo.local_replicas if topo else 0

    def device_of(self, local_index: int) -> str:
        topo = self.topology
        if topo and local_index < len(topo.devices):
            return topo.devices[local_index]
        return ""


@dataclass
class Telemetry:
    """All workers plus run-wide facts (configuration, topology)."""

    th: Thresholds
    workers: dict[str, WorkerTelemetry] = field(default_factory=dict)
    config: dict[str, object] = field(default_factory=dict)  # latest non-None Config fields
    topology: Topology | None = None  # the latest from any worker
    is_tpu: bool = False
    steps_seen: bool = False

    def worker(self, name: str) -> WorkerTelemetry:
        w = self.workers.get(name)
        if w is None:
            w = self.workers[name] = WorkerTelemetry(name, self.th)
        return w

    def on_config(self, m: Config) -> None:
        for f in ("mixed_precision", "global_batch_size", "per_replica_batch_size",
                  "steps_per_execution", "total_steps", "epochs"):
            v = getattr(m, f)
            if v is not None:
                self.config[f] = v

    def on_topology(self, w: WorkerTelemetry, m: Topology) -> None:
        w.topology = m
        self.topology = m
        self.is_tpu = self.is_tpu or m.is_tpu

    def step_workers(self) -> list[WorkerTelemetry]:
        return [w for w in self.workers.values() if w.records > 0]

    def steps_per_epoch(self) -> int | None:
        total, epochs = self.config.get("total_steps"), self.config.get("epochs")
        if isinstance(total, int) and isinstance(epochs, int) and epochs > 0 and total % epochs == 0:
            return total // epochs
        for w in self.workers.values():
            if w.epoch_end_steps and w.epoch_end_steps[0] > 0:
                return w.epoch_end_steps[0]
        return None

"""The one record per worker on the viewer side, and the rules' run-wide facts.

:class:`Worker` is everything known about one agent process: the facts its messages state (its
hello, strategies, newest step, exit, exception, phase, when it last spoke: :meth:`Worker.note`,
their one writer), the bounded windows the diagnostics rules read, and what the run state keeps
for the views (step statistics, ledger, host samples, connection). :class:`Telemetry` holds the
workers by name. A :class:`~tpuwatch.monitor.state.RunState` owns one, and the diagnostics engine
beside it (``FindingsFeed(state=...)``) reads and updates the same records; an engine alone has its
own. Every container is bounded, so memory does not grow with the length of the run.
"""

from __future__ import annotations

import copy
import math
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable

from tpuwatch.monitor.ledger import LedgerBuilder, UnreadWaits
from tpuwatch.monitor.tracebacks import strip_own_frames, without_own_frames
from tpuwatch.protocol import (
    AllocationSites,
    Config,
    DeviceSample,
    Epoch,
    ExceptionRaised,
    Exit,
    Hello,
    HostSample,
    HostSites,
    HostSummary,
    InputStages,
    Message,
    Phase,
    Pipeline,
    StackDump,
    Step,
    Teardown,
    Topology,
)

from .input_share import InputShare, InputTotals, recent_share
from .thresholds import Thresholds

if TYPE_CHECKING:
    from tpuwatch.monitor.snapshot import HostPoint
    from tpuwatch.monitor.stats import StepStats


def _new_stats() -> StepStats:
    # imported here: monitor.stats imports this package (robust_stats)
    from tpuwatch.monitor.stats import StepStats
    return StepStats()

#: One eligible step record in a window:
#: (step, t, step_time_s, input_wait_s or None, steps, function name, inside an automatic capture).
Rec = tuple[int, float, float, "float | None", int, str, bool]

#: The scope of a figure over every eligible step of a run (the words shown beside it).
WHOLE_RUN = "over the whole run"

_MAX_EXAMPLE_SIZES = 16  # distinct Step.examples values remembered (batch sizes seen)
_MAX_FIRST_FUNCTIONS = 16  # step functions whose first step times are kept (trend baselines)
_MAX_BYTES = 1 << 60  # byte counts beyond this are corrupt: ignored, never a crash
_MAX_PIPELINES = 8
_MAX_HOLDERS = 32  # pipeline stages holding host memory remembered per worker
#: Host samples the Memory panel charts (two a second by default: the last ~4 minutes).
HOST_HISTORY = 512
#: Stall stacks kept per worker (one per stall episode).
STALL_STACKS_KEPT = 16


@dataclass
class DevicePeak:
    device: str
    peak_bytes: int
    limit_bytes: int | None
    source: str
    limit_source: str
    t: float


@dataclass
class Worker:
    """One agent process, keyed by its worker name: the one record of it on the viewer side.

    Facts its messages state have one home each, written by :meth:`note` alone; the rules'
    windows and the views' statistics are kept beside them by their readers (the engine's
    ``on_*`` methods, the run state's handlers)."""

    name: str
    th: Thresholds
    order: int = 0  # order of first appearance
    # --- facts (written by note) ----------------------------------------------------------
    hello: Hello | None = None
    # Every strategy this worker announced, with the training steps run under it (the steps
    # after a Topology belong to it, counted by the run state); ``topology`` is the one that
    # trained most, ``latest_topology`` the newest.
    topologies: list[list[Any]] = field(default_factory=list)  # [Topology, steps]
    current_topology: int = -1
    topology_new: bool = False  # the newest Topology was a strategy not seen before
    #: The newest step record (a summary's newest step, as a Step, on the summary stream).
    last_step: Step | None = None
    #: The step record before it (what a rule observing a step compares it with).
    prev_step: Step | None = None
    stepped: bool = False  # the newest message noted moved ``last_step``
    #: Latest time any message of the worker carries (its exit's aside: the launcher's clock).
    last_t: float | None = None
    exit: Exit | None = None
    #: The script's exception, without tpuwatch's own frames.
    exception: ExceptionRaised | None = None
    #: The agent's current phase (None before any Phase message: an older agent).
    phase: Phase | None = None
    phase_new: bool = False  # the newest Phase began a phase (not an evaluation's progress)
    teardown_seen: tuple[float, float] | None = None  # (since, t) of the newest Teardown taken
    #: Its agent's sampler reports (host or device samples): silence then means no progress.
    samples_seen: bool = False
    #: The stacks its agent took by itself when steps stopped (StackDump reason "stall"), newest last.
    stall_stacks: deque[StackDump] = field(default_factory=lambda: deque(maxlen=STALL_STACKS_KEPT))
    _noted: Message | None = field(default=None, repr=False)
    # --- the run state's (views) ----------------------------------------------------------
    stats: StepStats = field(default_factory=_new_stats)
    last_losses: Step | None = None  # last step record that carried replica losses
    lost_reason: str | None = None
    connected: bool = True
    host: HostSample | None = None
    host_history: deque[HostPoint] = field(default_factory=lambda: deque(maxlen=HOST_HISTORY))
    rss_peak: int = 0
    ledger: LedgerBuilder = field(default_factory=LedgerBuilder)
    # The newest summary with step records (the summary stream: its p50 is the Workers panel's).
    summary: HostSummary | None = None
    summarised: bool = False  # some of its steps came only as summaries (not in the ledger)
    from_summary: bool = False  # its newest step came in a summary
    # --- the rules' -----------------------------------------------------------------------
    records: int = 0  # Step messages seen
    first_step_t: float | None = None
    #: Eligible records only (warm-up and boundary records left out).
    window: deque[Rec] = field(default_factory=deque)
    eligible: int = 0  # eligible records ever (the window keeps the latest)
    skip_left: int = 0
    #: Wall time between consecutive step records: the stall baseline.
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=101))
    # epochs
    epoch: int | None = None
    boundary_since_step: bool = False  # an Epoch message arrived after the last step record
    epoch_end_steps: list[int] = field(default_factory=list)  # first few only
    first_epoch_end_t: float | None = None
    epoch_begin_seen: bool = False
    longest_boundary_gap_s: float = 0.0
    # phases (the agent's Phase messages): the time since the last step that no phase explains.
    #: Start of the current stretch with nothing progressing (None: in a save, a new iterator or
    #: a trace, which count as progress while they last).
    quiet_since: float | None = None
    #: Longest stretch with nothing progressing since the last step record.
    longest_quiet_s: float = 0.0
    longest_quiet_at: float | None = None  # where that stretch began
    # host memory: one point per bucket (latest RSS in it), bounded
    #: (t, rss_bytes, untraced_bytes, counted_t): ``untraced_bytes`` leaves out the growth between
    #: two samples with a tf.function trace between them (traced graphs, the retrace finding's) or
    #: an automatic capture (the profiler's buffers); ``counted_t`` leaves out those intervals'
    #: time, so that a slope over it is the growth's own pace.
    rss_points: deque[tuple[float, int, int, float]] = field(default_factory=deque)
    rss_first_t: float | None = None
    rss_bucket_start_t: float = -math.inf
    #: (step, t, rss_bytes, untraced_bytes, counted_steps, counted_t) at host samples taken after a
    #: new step, bounded by thinning; ``counted_steps`` leaves out the steps of the intervals whose
    #: growth is left out (a growth per step over them is the script's).
    rss_step_points: list[tuple[int, float, int, int, int, float]] = field(default_factory=list)
    rss_last_step: int = 0  # the step at the latest host sample
    rss_left_out_steps: int = 0  # steps between samples whose growth is left out
    rss_left_out_s: float = 0.0  # and their time
    traces_since_sample: int = 0  # traces since the latest host sample
    #: An automatic capture ran since the latest host sample: the growth until the next one is
    #: the profiler's buffers (hundreds of MB for 1 s of a CPU run), no leak.
    captured_since_sample: bool = False
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
    #: The gap sampler's latest counts: where the time between steps goes, by the script's lines.
    host_sites: HostSites | None = None
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
    #: Input wait over every eligible record of the run whose wait is known (the whole-run
    #: verdict: :meth:`run_input_totals`). A record whose wait was not read counts as the goodput
    #: ledger counts it (:class:`UnreadWaits`): (step, step time, steps) held for the next read.
    input_totals: InputTotals = field(default_factory=InputTotals)
    unread_waits: UnreadWaits[tuple[int, float, int]] = field(default_factory=UnreadWaits)
    #: Step times of the first ``jitter_min_records`` eligible records per step function: the
    #: rising-trend baseline, the same whenever the rules are checked (live or a report).
    first_times: dict[str, list[float]] = field(default_factory=dict)

    #: The live window's input share and the ``eligible`` count it was computed at.
    _recent: tuple[InputShare | None, str] = field(default=(None, ""), init=False, repr=False)
    _recent_at: int = field(default=-1, init=False, repr=False)
    _run_totals: InputTotals | None = field(default=None, init=False, repr=False)
    _run_totals_at: int = field(default=-1, init=False, repr=False)

    def __post_init__(self) -> None:
        self.window = deque(maxlen=self.th.window_records)
        self.rss_points = deque(maxlen=self.th.rss_window_points)
        self.skip_left = self.th.warmup_records

    # --- facts ---------------------------------------------------------------------------------

    def note(self, msg: Message) -> None:
        """Takes the facts ``msg`` states about this worker: the one writer of them. Each reader
        of a message (the run state, then the engine beside it) calls it; the first call notes,
        the others find the message noted already. Costs a few attribute writes for a Step."""
        if msg is self._noted:
            return
        self._noted = msg
        if type(msg) is Step:
            self.prev_step, self.last_step, self.stepped = self.last_step, msg, True
            if self.last_t is None or msg.t > self.last_t:
                self.last_t = msg.t
            return
        self.stepped = False
        if isinstance(msg, Exit):
            self.exit = msg
            return  # its time is the launcher's when the launcher wrote it: no sign of life
        t = getattr(msg, "t", None)
        if isinstance(t, (int, float)) and (self.last_t is None or t > self.last_t):
            self.last_t = float(t)
        if isinstance(msg, (HostSample, DeviceSample)):
            self.samples_seen = True
        elif isinstance(msg, HostSummary):
            self._note_summary(msg)
        elif isinstance(msg, Hello):
            self.hello = msg
        elif isinstance(msg, Topology):
            self.topology_new = self._add_topology(msg)
        elif isinstance(msg, Phase):
            prev = self.phase
            self.phase_new = prev is None or prev.phase != msg.phase or prev.since != msg.since
            self.phase = msg
        elif isinstance(msg, StackDump):
            if msg.reason == "stall":
                self.stall_stacks.append(msg)
        elif isinstance(msg, ExceptionRaised):
            # shown to the user: without tpuwatch's own frames (runpy, the agent)
            self.exception = replace(msg, message=strip_own_frames(msg.message)[0],
                                     traceback=without_own_frames(msg.traceback))

    def _note_summary(self, m: HostSummary) -> None:
        """A summary's samples, its newest step and its time (never an older step than the newest
        known)."""
        if (m.host_t is not None and m.rss_bytes is not None) or (m.devices and m.device_t):
            self.samples_seen = True
        if m.step is None or m.step_t is None or (self.last_step is not None and m.step < self.last_step.step):
            return
        self.prev_step, self.stepped = self.last_step, True
        self.last_step = Step(step=m.step, t=m.step_t, step_time_s=m.step_time_p50_s or math.nan,
                              input_wait_s=None, loss=None, steps=m.steps, function=m.function, epoch=m.epoch)
        if self.last_t is None or m.step_t > self.last_t:
            self.last_t = m.step_t

    def _add_topology(self, msg: Topology) -> bool:
        """Makes ``msg`` the current strategy; True if it was not seen before."""
        key = (msg.strategy, msg.replicas, msg.devices, msg.num_workers)
        for i, (known, _) in enumerate(self.topologies):
            if (known.strategy, known.replicas, known.devices, known.num_workers) == key:
                self.topologies[i][0] = msg
                self.current_topology = i
                return False
        self.topologies.append([msg, 0])
        self.current_topology = len(self.topologies) - 1
        return True

    def count_steps(self, steps: int) -> None:
        """Training steps run under the current strategy (the run state counts them)."""
        if self.current_topology >= 0:
            self.topologies[self.current_topology][1] += steps

    @property
    def topology(self) -> Topology | None:
        """The strategy that trained most (the newest of equals)."""
        if len(self.topologies) < 2:  # the usual case, read for every worker at every snapshot
            return self.topologies[0][0] if self.topologies else None
        best = max(range(len(self.topologies)), key=lambda i: (self.topologies[i][1], i))
        topo: Topology = self.topologies[best][0]
        return topo

    @property
    def latest_topology(self) -> Topology | None:
        """The strategy announced last."""
        if self.current_topology < 0:
            return None
        topo: Topology = self.topologies[self.current_topology][0]
        return topo

    @property
    def step(self) -> int:
        """The newest step's number (0 before any)."""
        return self.last_step.step if self.last_step is not None else 0

    @property
    def last_step_t(self) -> float | None:
        """The newest step's time (unix seconds)."""
        return self.last_step.t if self.last_step is not None else None

    # --- updates (called by the engine, after note) --------------------------------------------

    def on_step(self, m: Step) -> None:
        self.records += 1
        prev_t = self.prev_step.t if self.prev_step is not None else None
        if prev_t is not None:
            gap = m.t - prev_t
            if gap > 0:
                self.intervals.append(gap)
                if self.boundary_since_step and gap > self.longest_boundary_gap_s:
                    self.longest_boundary_gap_s = gap
        else:
            self.first_step_t = m.t
        self.quiet_since = m.t
        self.longest_quiet_s = 0.0
        self.longest_quiet_at = None
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
        st = m.step_time_s
        if not (st > 0 and math.isfinite(st)):
            return
        wait = m.input_wait_s
        if wait is not None and not math.isfinite(wait):
            wait = None
        k = m.steps if m.steps > 0 else 1
        if wait is not None:
            for step, st_u, k_u in self.unread_waits.release(m.function, wait):
                self.input_totals.add(step, st_u, wait, k_u)
            self.input_totals.add(m.step, st, wait, k)
        else:
            if not self.unread_waits.hold(m.function, (m.step, st, k)):
                latest = self.unread_waits.latest(m.function)
                if latest is not None:
                    self.input_totals.add(m.step, st, latest, k)
        # the steps of an automatic capture (the profiler slows them) are marked: the step-time
        # rules leave them out, the input and straggler figures keep them (the capture starts
        # when the wait rises: on a short run, or on a pod's slow host, they were the evidence)
        self.window.append((m.step, m.t, st, wait, k, m.function, self.capturing))
        self.eligible += 1
        if self.capturing:
            return
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
        if self.stepped:  # it is the newest step (note)
            if self.prev_step is None:
                self.first_step_t = m.step_t
            self.quiet_since = m.step_t
            self.longest_quiet_s = 0.0
            self.longest_quiet_at = None
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
        self.window.append((m.step, m.step_t, st, wait, m.steps, m.function, False))
        self.eligible += 1

    def on_phase(self, m: Phase) -> None:
        """Evaluations progress by their calls; saves, new iterators and traces while they last;
        anything else (host time, training between steps) is quiet until the next step."""
        new = self.phase_new  # (note)
        if m.phase in ("checkpointing", "iterator", "compiling", "evaluating"):
            at = m.since if new else m.t
            self._close_quiet(at)
            # an evaluation is quiet again until its next progress report
            self.quiet_since = m.t if m.phase == "evaluating" else None
        elif self.quiet_since is None:
            self.quiet_since = max(m.since, self.last_step_t or m.since)

    def on_teardown(self, m: Teardown) -> None:
        """TensorFlow deleting an iterator progresses while it lasts (named work: the ledger books
        it as *teardown*), for up to ``stall_boundary_min_s`` after it began, as a trace does: a
        deletion that waits on a ``tf.numpy_function`` that never returns is a hang. After it the
        script is quiet until its next step or phase, unless a save or a new iterator it ended
        inside still progresses. A message older than the newest step, or than the newest one
        of the same teardown, says nothing new (the agent's thread can send its last look late)."""
        seen = self.teardown_seen
        last_step_t = self.last_step_t
        if (last_step_t is not None and m.t < last_step_t) or (
                seen is not None and seen[0] == m.since and m.t <= seen[1]):
            return
        if seen is None or seen[0] != m.since:
            self._close_quiet(m.since)
        self.teardown_seen = (m.since, m.t)
        self.quiet_since = m.since + self.th.stall_boundary_min_s
        if not m.under_way:
            self._close_quiet(m.t)  # what lasted past the bound
            within = self.phase is not None and self.phase.phase in ("checkpointing", "iterator")
            self.quiet_since = None if within else m.t

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
        again = [i for i, p in enumerate(self.pipelines) if p.dataset == m.dataset]
        if again:  # the same dataset, said again (where its batches are fetched): replaces it
            self.pipelines[again[0]] = m
            return
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
        if not (0 <= m.rss_bytes < _MAX_BYTES and 0 <= m.available_bytes < _MAX_BYTES):
            return
        self.available_bytes = m.available_bytes
        self.total_bytes = m.total_bytes
        if self.rss_first_t is None:
            self.rss_first_t = m.t
        traced, self.traces_since_sample = self.traces_since_sample, 0
        captured, self.captured_since_sample = self.captured_since_sample, self.capturing
        grown = m.rss_bytes - self.rss_last if self.rss_last is not None else 0
        step = self.step
        left_out = captured or (traced and grown > 0)
        if left_out and self.rss_last is not None and self.rss_points:
            # the interval's steps and time go with its growth: a slope over what is left is the
            # script's own pace
            self.rss_left_out_steps += max(0, step - self.rss_last_step)
            self.rss_left_out_s += max(0.0, m.t - self.rss_points[-1][0])
        self.rss_last, self.rss_last_step = m.rss_bytes, step
        if captured:
            pass  # the profiler's own memory: neither the script's growth nor traced graphs
        elif traced and grown > 0:
            self.traced_growth_bytes += grown
            self.traced_growth_intervals += 1
        else:
            self.rss_untraced += grown
        untraced = self.rss_untraced
        counted_t = m.t - self.rss_left_out_s
        if self.rss_points and m.t - self.rss_bucket_start_t < self.th.rss_bucket_s:
            # same bucket: keep its latest sample
            self.rss_points[-1] = (m.t, m.rss_bytes, untraced, counted_t)
        else:
            self.rss_bucket_start_t = m.t
            self.rss_points.append((m.t, m.rss_bytes, untraced, counted_t))
        if step > 0:
            pts = self.rss_step_points
            point = (step, m.t, m.rss_bytes, untraced, step - self.rss_left_out_steps, counted_t)
            if pts and pts[-1][0] == step:
                pts[-1] = point
            else:
                if len(pts) >= self.th.rss_step_points:
                    del pts[1::2]  # keep every other point: the fit needs the shape, not all
                pts.append(point)

    def on_device(self, m: DeviceSample) -> None:
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
        return self.exit is not None or self.exception is not None

    def run_input_totals(self) -> InputTotals:
        """The input totals of every eligible record so far, those whose read has not come
        counted at their function's latest read (as the ledger counts them); computed again
        only when a record came (the engine asks at every evaluation)."""
        if not self.unread_waits:
            return self.input_totals
        if self._run_totals_at == self.eligible and self._run_totals is not None:
            return self._run_totals
        totals = copy.copy(self.input_totals)
        last = totals.last_step
        for (step, st, k), wait in self.unread_waits.pending(never_read=False):
            totals.add(step, st, wait or 0.0, k)
            last = max(last, step)
        totals.last_step = last
        self._run_totals, self._run_totals_at = totals, self.eligible
        return totals

    def input_share(self) -> tuple[InputShare | None, str]:
        """This worker's input wait as the ``input-bound`` rule judges it, with its scope in
        words: the latest window while the worker runs, every eligible step once it has ended."""
        if self.ended:
            return self.run_input_totals().share(self.th), WHOLE_RUN
        return self.recent_input_share()

    def recent_input_share(self) -> tuple[InputShare | None, str]:
        """The input share over the live window and its scope (:func:`recent_share`), computed
        again only when the window moved (every record it takes counts in ``eligible``): the
        ``input-bound`` rule and the engine's figures ask each worker at every evaluation, and
        on a pod most workers' windows move once a second."""
        if self._recent_at != self.eligible:
            self._recent = recent_share(self.window, self.th)
            self._recent_at = self.eligible
        return self._recent

    def replica_offset(self) -> int:
        """Global index of this worker's first replica (0 without a topology)."""
        topo = self.latest_topology
        return topo.worker_index * topo.local_replicas if topo else 0

    def device_of(self, local_index: int) -> str:
        topo = self.latest_topology
        if topo and local_index < len(topo.devices):
            return topo.devices[local_index]
        return ""


@dataclass
class Telemetry:
    """All workers (each one :class:`Worker`, by name, in order of first appearance) plus
    run-wide facts: the run's configuration (the run state's too) and what the rules read of the
    topology."""

    th: Thresholds
    workers: dict[str, Worker] = field(default_factory=dict)
    config: dict[str, object] = field(default_factory=dict)  # latest non-None Config fields (the run's)
    topology: Topology | None = None  # the latest from any worker
    is_tpu: bool = False
    steps_seen: bool = False
    #: The worker a message without a name belongs to: the last Hello's (see :meth:`hello`).
    default: str | None = None
    #: Makes a new worker's step statistics (the run state's window sizes).
    new_stats: Callable[[], StepStats] = _new_stats

    def worker(self, name: str | None) -> Worker:
        """The record of ``name`` (``None``: the default worker), made on first mention."""
        if name is None:
            name = self.default or ""
        w = self.workers.get(name)
        if w is None:
            w = self.workers[name] = Worker(name, self.th, order=len(self.workers), stats=self.new_stats())
            if self.default is None:
                self.default = name
        return w

    def hello(self, name: str) -> None:
        """A stream's Hello names its worker: it becomes the default, and what arrived unnamed
        before it (a viewer attached mid-run) is that worker's."""
        anon = self.workers.get("")
        if anon is not None and anon.hello is None and name not in self.workers:
            del self.workers[""]
            anon.name = name
            self.workers[name] = anon
        self.default = name

    def on_config(self, m: Config) -> None:
        """The latest value of each field a Config carried (the run state reads them too)."""
        for f in ("mixed_precision", "global_batch_size", "per_replica_batch_size",
                  "steps_per_execution", "total_steps", "epochs", "keras_version"):
            v = getattr(m, f)
            if v is not None:
                self.config[f] = v

    def on_topology(self, m: Topology) -> None:
        self.topology = m
        self.is_tpu = self.is_tpu or m.is_tpu

    def step_workers(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.records > 0]

    def steps_per_epoch(self) -> int | None:
        total, epochs = self.config.get("total_steps"), self.config.get("epochs")
        if isinstance(total, int) and isinstance(epochs, int) and epochs > 0 and total % epochs == 0:
            return total // epochs
        for w in self.workers.values():
            if w.epoch_end_steps and w.epoch_end_steps[0] > 0:
                return w.epoch_end_steps[0]
        return None

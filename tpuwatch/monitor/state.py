"""Run state built from protocol messages, and the immutable snapshots everything renders.

:class:`RunState` takes every message of a run (``apply``), from one or several agents (one per
worker of a multi-host job), and answers :meth:`RunState.snapshot` — a
:class:`~tpuwatch.monitor.snapshot.RunSnapshot` that the dashboard, the headless progress line
and ``tpuwatch report`` read.

Workers: each message is attributed to a worker name. With one stream, call ``apply(msg)``: the
name comes from the stream's :class:`~tpuwatch.protocol.Hello`. When merging several streams,
call ``apply(msg, worker=name)`` with the name from that stream's Hello. Run-level progress
(step, speed, history) follows the *primary* worker (the one with ``worker_index`` 0, else the
first to say hello): in synchronous training every worker runs the same global steps.

Cost: ``apply`` of a step record is O(1) (~2-4 us); ``snapshot()`` is O(window + events +
history points), well under a millisecond to a few, at any run length (see the tests).
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping

from tpuwatch import units
from tpuwatch.monitor.baseline import Baseline
from tpuwatch.monitor.diagnostics.input_share import InputFigures
from tpuwatch.monitor.diagnostics.telemetry import Telemetry, Worker
from tpuwatch.monitor.diagnostics.thresholds import Thresholds
from tpuwatch.monitor.diagnostics.tracing import closest_change, remember_signature
from tpuwatch.monitor.ledger import Ledger, merge
from tpuwatch.monitor.runs import ended_state
from tpuwatch.monitor.snapshot import (
    CommandStatus,
    CommandView,
    DeviceMemory,
    FunctionTraces,
    HostMemory,
    HostPoint,
    LogEntry,
    ReplicaLoss,
    RunSnapshot,
    RunStatus,
    WorkerView,
    mean_loss,
)
from tpuwatch.monitor.stats import RATE_WINDOW_S, History, Rolling, StepStats
from tpuwatch.protocol import DISK_FULL_SOURCE as DISK_FULL
from tpuwatch.protocol import (
    NEW_OBJECT_CHANGE,
    Command,
    CommandState,
    Config,
    DeviceSample,
    Epoch,
    Event,
    EventFact,
    ExceptionRaised,
    Exit,
    Finding,
    Hello,
    HostSample,
    HostSummary,
    Message,
    Phase,
    Pipeline,
    Result,
    Retrace,
    StackDump,
    Step,
    StepLoss,
    Teardown,
    Topology,
    event_fact,
)

#: The diagnostics rule whose live verdict is the "stalled" status (monitor/diagnostics/progress.py).
STALL_RULE = "stall"
#: A worker whose agent sampled before and has sent nothing at all for this long (on the
#: viewer's clock) is stalled too: the whole process is quiet (stopped, frozen holding the GIL,
#: or its recording does not arrive), which the stall rule, measuring gaps on the agent's own
#: clock, cannot see. The Findings panel says so when it is the reason.
SILENT_AFTER_S = 60.0

#: The names users know for TensorFlow's strategy classes.
_STRATEGY_NAMES = {
    "_DefaultDistributionStrategy": "default strategy",
    "CollectiveAllReduceStrategy": "MultiWorkerMirroredStrategy",
    "_CollectiveAllReduceStrategyExperimental": "MultiWorkerMirroredStrategy",
    "TPUStrategyV2": "TPUStrategy",
    "ParameterServerStrategyV2": "ParameterServerStrategy",
}


def strategy_name(class_name: str) -> str:
    """``tf.distribute`` name of a strategy class ("default strategy" for the default one)."""
    return _STRATEGY_NAMES.get(class_name, class_name)

#: History points kept for a worker that is not the primary (worker_index != 0): enough to plot
#: it should it become the primary (worker 0 never seen), without a full history per host of a pod.
SECONDARY_HISTORY_POINTS = 200
_SEVERITY_LEVEL = {"info": "info", "warning": "warning", "critical": "error"}


def finding_key(f: Finding, worker: str = "") -> tuple[str, str, str]:
    """Identity of a finding: (rule, worker, subject). A rule that reports about several things
    at once names the thing in ``evidence["subject"]``; failing that, its ``function`` or
    ``replica`` evidence (what the diagnostics rules report per function / per replica)."""
    ev = f.evidence
    subject = ev.get("subject")
    if subject is None:
        subject = ev.get("function")
    if subject is None:
        subject = ev.get("replica", "")
    return (f.rule, f.worker or worker, str(subject))


_MAX_PIPELINES = 16  # pipelines kept for the map (a script making datasets in a loop stops here)


DISK_FULL_SOURCE = DISK_FULL

#: Kinds that change numbers, not news a viewer must show at once (``RunState.version``): samples,
#: summaries, a phase's progress (a new phase is news: ``_phase``), and who a worker is (its hello,
#: strategy and config; shown with the next frame: a pod's thousand hosts join over seconds, and a
#: frame of them for each drain cost the viewer the CPU it needed to take them in).
_NOT_NEWS = frozenset({HostSample, DeviceSample, Phase, HostSummary, Hello, Topology, Config})


def _ledger_only(msg: Message, w: Worker) -> None:
    """A message only the worker's ledger reads (it takes every message after its handler)."""


class RunState:
    """Mutable state of one run; feed it messages, read snapshots.

    ``clock`` gives unix time (seconds) for status ages. A running worker is "stalled" while the
    diagnostics' ``stall`` rule says so (its finding, added by the findings feed every viewer
    runs beside the state): the badge and the Findings panel then agree by construction; or
    when it has gone silent altogether (:data:`SILENT_AFTER_S`). Not
    thread-safe: apply and snapshot from one thread (the UI's, or the headless loop's).
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        *,
        max_events: int = 500,
        max_commands: int = 100,
        window: int = 200,
        rate_window_s: float = RATE_WINDOW_S,
        history_points: int = 2000,
        max_retraces: int = 1000,
    ) -> None:
        self.clock = clock
        self._window = window
        #: The workers' records (one :class:`Worker` each), which the diagnostics engine beside
        #: this state reads and updates too (``FindingsFeed(state=...)``).
        self.telemetry = Telemetry(Thresholds(), new_stats=lambda: StepStats(
            window, rate_window_s, history_points=history_points))
        self._workers = self.telemetry.workers
        # input wait by the diagnostics' definition, set by the findings feed (the one computation)
        self._input = InputFigures()
        #: A finished run the snapshot carries for deltas (``tpuwatch run --baseline``).
        self.baseline: Baseline | None = None
        self._events: deque[LogEntry] = deque(maxlen=max_events)
        self._commands: dict[str, CommandView] = {}
        self._max_commands = max_commands
        self._findings: dict[tuple[str, str, str], Finding] = {}
        self._new_findings: deque[Finding] = deque(maxlen=100)
        self._functions: dict[str, FunctionTraces] = {}
        self._retraces: deque[Retrace] = deque(maxlen=max_retraces)
        self._pipelines: list[tuple[str, Pipeline]] = []  # the first _MAX_PIPELINES
        self._signatures: dict[tuple[str, str], list[dict[str, str]]] = {}  # (worker, function)
        self._epoch_logs: deque[tuple[int, Mapping[str, object]]] = deque(maxlen=1000)
        # The newest sample per (worker, device); made into DeviceMemory at snapshot time only (a
        # pod's chips send thousands of samples between two snapshots).
        self._devices: dict[tuple[str, str], DeviceSample] = {}
        # What the snapshot shows of each device, built again only for a new sample (a pod has
        # thousands of devices, most unchanged between two frames), in the devices' order.
        self._device_views: dict[tuple[str, str], tuple[DeviceSample, DeviceMemory]] = {}
        self._device_order: list[tuple[str, str]] = []
        self._device_peaks: dict[tuple[str, str], int] = {}
        self._disabled: dict[str, str] = {}
        self._device_mem_notes: dict[str, str] = {}  # device -> why its memory cannot be read
        self._epoch: int | None = None
        self._stop_requested = False  # a viewer recorded that the user asked to stop
        self._stack_dumps: deque[StackDump] = deque(maxlen=10)
        self._last_t: float | None = None  # latest message time seen
        self._started_t: float | None = None
        self.messages = 0
        #: Grows whenever something a viewer should see at once arrives or changes (anything but
        #: steps and samples: a hello, an event, a command's progress, a finding, an exit, a
        #: worker's connection). Cheaper to watch than building a snapshot (see ui/pacer.py).
        self.version = 0
        self.malformed = 0
        self.unknown = 0
        self.truncated_tail = False
        self._tpu_note = ""
        # What the recording may be missing: full-disk losses the agent noted, a hard end.
        self._gaps: list[str] = []
        # Each handler takes the message of its own type (Any: a dict keyed by type cannot say so).
        self._handlers: dict[type, Callable[[Any, Worker], None]] = {
            Hello: self._hello,
            Topology: self._topology,
            Config: self._config_msg,
            Step: self._step,
            StepLoss: self._step_loss,
            HostSample: self._host,
            DeviceSample: self._device,
            Retrace: self._retrace,
            Pipeline: self._pipeline,
            Epoch: self._epoch_msg,
            Event: self._event,
            ExceptionRaised: self._exception,
            Exit: self._exit,
            Command: self._command,
            CommandState: self._command_state,
            Result: self._result,
            StackDump: self._stack_dump,
            Finding: self._finding,
            Phase: self._phase,
            HostSummary: self._summary,
            Teardown: _ledger_only,
        }
        self._stalls: Mapping[str, list[tuple[float, float]]] = {}

    # --- input ----------------------------------------------------------------------------------

    def apply(self, msg: Message, worker: str | None = None) -> None:
        """Takes one message. ``worker``: the name from that stream's Hello (default: the last
        Hello seen without an explicit worker). Messages of kinds a viewer never receives
        (Attach) are ignored."""
        self.messages += 1
        if type(msg) is Step:  # the hot path: most messages of a run
            w = self._workers.get(worker or self.telemetry.default or "")
            if w is None:
                w = self.telemetry.worker(worker)
            self._step(msg, w)
            w.ledger.apply(msg)
            return
        handler = self._handlers.get(type(msg))
        if handler is None:
            return
        if type(msg) not in _NOT_NEWS:
            self.version += 1
        if type(msg) is Hello and worker is None:
            worker = msg.worker
            self.telemetry.hello(worker)
        w = self.telemetry.worker(worker)
        t = getattr(msg, "t", None)
        if t is not None and (self._last_t is None or t > self._last_t):
            self._last_t = t
        handler(msg, w)  # it notes the facts where it needs them noted; else here, after it
        w.note(msg)
        w.ledger.apply(msg)

    def apply_all(self, messages: Iterable[Message], worker: str | None = None) -> None:
        for m in messages:
            self.apply(m, worker)

    def note_read_stats(self, *, malformed: int, unknown: int, truncated_tail: bool) -> None:
        """Recording health, from :class:`~tpuwatch.monitor.recording.ReadStats` (totals)."""
        self.malformed = malformed
        self.unknown = unknown
        self.truncated_tail = truncated_tail

    def set_lost(self, reason: str = "the process vanished without an exit record",
                 worker: str | None = None) -> None:
        """The launcher saw the process gone without an Exit: the run (or ``worker``) is lost.

        Ignored for a worker that has already exited."""
        targets = [self.telemetry.worker(worker)] if worker is not None else list(self._workers.values())
        if not targets:
            targets = [self.telemetry.worker(None)]
        for w in targets:
            if w.exit is None and w.lost_reason is None:
                w.lost_reason = reason
                w.connected = False
                self._log(self._now_t(), "error", "launcher", f"run lost: {reason}", w.name)

    def set_connected(self, connected: bool, worker: str | None = None) -> None:
        """Whether a live connection to the worker's agent is held (for ``WorkerView``)."""
        w = self.telemetry.worker(worker)
        if w.connected != connected:
            w.connected = connected
            self.version += 1

    # --- handlers ------------------------------------------------------------------------------

    def _now_t(self) -> float:
        return self._last_t if self._last_t is not None else self.clock()

    def _log(self, t: float, level: str, source: str, message: str, worker: str = "", news: bool = True) -> None:
        if news:
            self.version += 1  # a new event line (a finding, a lost run): news for a viewer
        self._events.append(LogEntry(t=t, level=level, source=source, message=message,
                                     worker=worker))

    def _hello(self, msg: Hello, w: Worker) -> None:
        if self._started_t is None or msg.t < self._started_t:
            self._started_t = msg.t
        self._log(msg.t, "info", "agent",
                  f"{msg.script} started on {msg.host} (pid {msg.pid}, TF {msg.tf_version})",
                  w.name, news=False)  # who the worker is (_NOT_NEWS): with the next frame

    def _topology(self, msg: Topology, w: Worker) -> None:
        w.note(msg)
        first = w.topology_new
        if msg.worker_index != 0 and w.stats.records == 0:
            # Only the primary worker's history is plotted; the others keep a short one (a
            # viewer of 256 hosts held ~180 MB of histories nobody looks at).
            w.stats.history = History(SECONDARY_HISTORY_POINTS)
        if first:
            self._log(msg.t, "info", "agent",
                      f"{strategy_name(msg.strategy)} with {units.replicas(msg.replicas)} on {msg.device_kind}", w.name,
                      news=False)

    def _config_msg(self, msg: Config, w: Worker) -> None:
        self.telemetry.on_config(msg)  # the run's configuration: one home, the records' (idempotent)

    def _step(self, msg: Step, w: Worker) -> None:
        w.note(msg)
        w.count_steps(msg.steps)
        w.stats.add(msg)
        w.from_summary = False
        if msg.replica_losses:
            w.last_losses = msg
        t = msg.t
        if self._last_t is None or t > self._last_t:
            self._last_t = t
        if msg.epoch is not None:
            self._epoch = msg.epoch

    def _summary(self, msg: HostSummary, w: Worker) -> None:
        """A summary-stream interval: the newest step and its time, the losses with the step they
        belong to (never a newer step's), the newest host and device samples as recorded."""
        w.note(msg)  # its newest step (never older than the newest known)
        if w.stepped:
            w.count_steps(msg.steps)
            w.summarised = True
            w.summary = msg if msg.records else w.summary
            w.from_summary = True
            if msg.epoch is not None:
                self._epoch = msg.epoch
        if msg.loss_step is not None and (msg.replica_losses or msg.loss is not None) and (
                w.last_losses is None or msg.loss_step >= w.last_losses.step):
            w.last_losses = Step(step=msg.loss_step, t=msg.step_t or msg.t, step_time_s=math.nan, input_wait_s=None,
                                 loss=msg.loss, replica_losses=msg.replica_losses)
        host = msg.host_sample()
        if host is not None:
            self._host(host, w)
        for d in msg.device_samples():
            self._device(d, w)

    def _phase(self, msg: Phase, w: Worker) -> None:
        if msg.phase == "starting" and (self._started_t is None or msg.since < self._started_t):
            # the launch (the process's creation), where the ledger's wall time starts: the run's
            # duration is one figure in the header, the summary, the report and the ledger
            self._started_t = msg.since
        w.note(msg)
        if w.phase_new:
            self.version += 1  # a new phase is news; an evaluation's progress is a number

    def set_stall_episodes(self, episodes: Mapping[str, list[tuple[float, float]]]) -> None:
        """The stall rule's episodes per worker, (start, end) unix: the ledger's *stalled* time."""
        self._stalls = episodes

    def _ledger(self, workers: list[Worker], now: float, live: bool) -> Ledger | None:
        return merge([(w.name, w.ledger.ledger(self._stalls.get(w.name, ()), now=now if live else None))
                      for w in workers if not w.summarised
                      and (w.ledger.steps or w.ledger.exit_t is not None or w.phase is not None)])

    def _step_loss(self, msg: StepLoss, w: Worker) -> None:
        """The last step's losses, read after it: they belong to that step and nothing newer."""
        last = w.last_step
        if last is None or last.step != msg.step or (w.last_losses is not None and w.last_losses.step >= msg.step):
            return
        w.last_losses = replace(last, loss=msg.loss, replica_losses=msg.replica_losses)

    def _host(self, msg: HostSample, w: Worker) -> None:
        w.host = msg
        w.host_history.append(HostPoint(t=msg.t, rss_bytes=msg.rss_bytes, cpu_percent=msg.cpu_percent,
                                        load_1m=msg.load_1m))
        if msg.rss_bytes > w.rss_peak:
            w.rss_peak = msg.rss_bytes

    def _device(self, msg: DeviceSample, w: Worker) -> None:
        key = (w.name, msg.device)
        self._devices[key] = msg
        peak = max(msg.peak_bytes, msg.current_bytes)
        if peak > self._device_peaks.get(key, 0):
            self._device_peaks[key] = peak

    def _pipeline(self, msg: Pipeline, w: Worker) -> None:
        for i, (name, p) in enumerate(self._pipelines):
            if name == w.name and p.dataset == msg.dataset:  # the same dataset, said again (its fetch site)
                self._pipelines[i] = (name, msg)
                return
        if len(self._pipelines) < _MAX_PIPELINES:
            self._pipelines.append((w.name, msg))

    def _retrace(self, msg: Retrace, w: Worker) -> None:
        # the change that made TF trace again: against the closest trace it has, as the
        # retrace-storm finding says it (the agent's is against the previous trace)
        name = units.function_label(msg.function, msg.evaluation)
        seen = self._signatures.setdefault((w.name, name), [])
        if msg.change and msg.change != NEW_OBJECT_CHANGE:
            msg = replace(msg, change=closest_change(seen, msg.signature) or msg.change)
        remember_signature(seen, msg.signature)
        self._retraces.append(msg)
        prev = self._functions.get(name)
        if prev is None:
            self._log(msg.t, "info", "retrace", f"traced {name} {msg.signature}", w.name)
        # Several workers trace the same function: keep the largest counts seen.
        traces = max(msg.traces, prev.traces if prev else 0)
        instances = max(msg.instances, prev.instances if prev else 0)
        self._functions[name] = FunctionTraces(
            name=msg.function, traces=traces, instances=instances,
            last_change=msg.change or (prev.last_change if prev else ""),
            last_signature=msg.signature, last_step=msg.step, t=msg.t, evaluation=msg.evaluation)

    def _epoch_msg(self, msg: Epoch, w: Worker) -> None:
        if msg.phase == "begin":
            self._epoch = msg.epoch
            self._log(msg.t, "info", "keras", f"epoch {msg.epoch + 1} began", w.name)
        else:
            if msg.logs:
                self._epoch_logs.append((msg.epoch, dict(msg.logs)))
            logs = ", ".join(f"{k}={_fmt_scalar(v)}" for k, v in msg.logs.items())
            self._log(msg.t, "info", "keras",
                      f"epoch {msg.epoch + 1} ended" + (f": {logs}" if logs else ""), w.name)

    def _event(self, msg: Event, w: Worker) -> None:
        self._log(msg.t, msg.level, msg.source, msg.message, w.name)
        if msg.source == DISK_FULL_SOURCE and len(self._gaps) < 100:
            self._gaps.append(msg.message)
        fact, subject, reason = event_fact(msg)  # typed fields (older recordings: their words)
        if fact == EventFact.STOP_REQUESTED:
            self._stop_requested = True
        elif fact == EventFact.TPU_METRICS_UNAVAILABLE:
            self._tpu_note = reason
        elif fact == EventFact.TPU_METRICS_AVAILABLE:
            self._tpu_note = ""
        elif fact == EventFact.PROBE_DISABLED:
            self._disabled[subject] = reason
        elif fact == EventFact.DEVICE_MEMORY_UNAVAILABLE:
            self._device_mem_notes[subject] = reason

    def _exception(self, msg: ExceptionRaised, w: Worker) -> None:
        w.note(msg)  # shown to the user without tpuwatch's own frames (runpy, the agent)
        text = w.exception.message if w.exception is not None else msg.message
        self._log(msg.t, "error", "script", f"{msg.type}: {text}", w.name)

    def _exit(self, msg: Exit, w: Worker) -> None:
        if msg.source == "launcher" and w.exit is None and len(self._gaps) < 100:
            # The agent did not end the run itself (killed, crashed hard): what it had not yet
            # written (one flush interval, 1/sample-hz, 0.25 s by default) is not in the recording.
            who = f"{w.name}: " if w.name else ""
            self._gaps.append(f"{who}the process ended abruptly ({msg.reason or 'no exit record'}); "
                              "the last fraction of a second before it (one agent flush, 0.25 s by "
                              "default) may be missing")
        w.note(msg)
        w.connected = False
        text = f"exited with code {msg.exit_code}"
        if msg.signal is not None:
            text += f" (signal {msg.signal})"
        if msg.reason:
            text += f": {msg.reason}"
        self._log(msg.t, "info" if msg.exit_code == 0 else "error", msg.source, text, w.name)

    def _set_command(self, id_: str, action: str, status: CommandStatus, message: str, details: Mapping[str, object],
                     t: float) -> None:
        self._commands.pop(id_, None)  # re-insert: most recently changed last
        self._commands[id_] = CommandView(id=id_, action=action, status=status, message=message,
                                          details=dict(details), t=t)
        while len(self._commands) > self._max_commands:
            oldest = next(iter(self._commands))
            del self._commands[oldest]

    def _command(self, msg: Command, w: Worker) -> None:
        if msg.id in self._commands:  # a duplicate request never resets progress
            return
        self._set_command(msg.id, msg.action, "pending", "", msg.args, self._now_t())

    def _command_state(self, msg: CommandState, w: Worker) -> None:
        prev = self._commands.get(msg.id)
        if prev is not None and prev.status in ("done", "failed"):
            return
        details = dict(prev.details) if prev else {}
        if msg.step is not None:
            details["step"] = msg.step
        self._set_command(msg.id, msg.action, msg.state, "", details, msg.t)

    def _result(self, msg: Result, w: Worker) -> None:
        self._set_command(msg.id, msg.action, "done" if msg.ok else "failed", msg.message,
                          msg.details, msg.t)
        self._log(msg.t, "info" if msg.ok else "error", f"command:{msg.action}", msg.message,
                  w.name)

    def _stack_dump(self, msg: StackDump, w: Worker) -> None:
        self._stack_dumps.append(msg)
        where = f" ({msg.path})" if msg.path else ""
        if msg.reason == "stall":
            gap = f" {units.finding_duration(msg.gap_s)}" if msg.gap_s is not None else ""
            self._log(msg.t, "info", "agent:stacks", f"no step for{gap} after step {msg.step}: the agent took every "
                                                     f"thread's stack; training thread {msg.headline}{where}", w.name)
            return
        self._log(msg.t, "info", "command:stack_dump", f"stack dump taken{where}", w.name)

    def _finding(self, msg: Finding, w: Worker) -> None:
        self.add_finding(msg, worker=w.name)

    def add_finding(self, f: Finding, worker: str = "") -> bool:
        """Keeps ``f`` as the latest finding for its (rule, worker, subject); logs it when it is
        new or its severity changed. Returns True in that case. Used for Finding messages and by
        the diagnostics engine's results."""
        key = finding_key(f, worker)
        prev = self._findings.get(key)
        self._findings[key] = f
        if prev is None or prev.severity != f.severity:
            self._new_findings.append(f)
            self._log(f.t, _SEVERITY_LEVEL.get(f.severity, "warning"), f"diagnostics:{f.rule}",
                      f.message, key[1])
            return True
        return False

    @property
    def started_t(self) -> float | None:
        """When the run began: the process's launch as the agent's first phase names it, else
        its first message (the header's elapsed time counts from it)."""
        return self._started_t

    def drop_finding(self, f: Finding, worker: str = "") -> None:
        """Forgets the finding kept for ``f``'s (rule, worker, subject): the diagnostics engine
        folded it into the finding of its cause."""
        self._findings.pop(finding_key(f, worker), None)

    def drain_new_findings(self) -> list[Finding]:
        """Findings that were new (or changed severity) since the last call, oldest first."""
        out = list(self._new_findings)
        self._new_findings.clear()
        return out

    # --- output ----------------------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        """True when every worker seen has an exit record."""
        return bool(self._workers) and all(
            w.exit is not None for w in self._workers.values() if w.hello or w.last_step or w.exit)

    @property
    def stack_dumps(self) -> tuple[StackDump, ...]:
        return tuple(self._stack_dumps)

    @property
    def last_message_t(self) -> float | None:
        """Time of the newest message (use as ``now`` when replaying a recording)."""
        return self._last_t

    def _primary(self) -> Worker | None:
        if not self._workers:
            return None
        best = None
        for w in self._workers.values():
            if w.hello is None and w.last_step is None and w.topology is None:
                continue
            if best is None:
                best = w
            elif w.topology is not None and w.topology.worker_index == 0 and (
                    best.topology is None or best.topology.worker_index != 0):
                best = w
        return best or next(iter(self._workers.values()))

    def _worker_status(self, w: Worker, now: float) -> RunStatus:
        if w.exit is not None:
            if w.exit.exit_code == 0 and w.exception is None:
                return "finished"
            if w.exception is None and ended_state(w.exit.exit_code, self._stop_requested) == "stopped":
                return "stopped"
            return "crashed"
        if w.exception is not None:
            return "crashed"
        if w.lost_reason is not None:
            return "lost"
        if w.last_step is None:
            return "starting" if (w.hello is not None or w.topology is not None) else "waiting"
        if self._stall_ongoing(w) or self._silent(w, now):
            return "stalled"
        return "running"

    @staticmethod
    def _silent(w: Worker, now: float) -> bool:
        return w.samples_seen and w.last_t is not None and now - w.last_t > SILENT_AFTER_S

    def _stall_ongoing(self, w: Worker) -> bool:
        """The stall rule's live verdict on ``w``: its finding says the gap after ``w``'s latest
        step still goes on. (A step after the hang ends it at once, before the next evaluation
        updates the finding: the finding is about an earlier step then.)"""
        f = self._findings.get((STALL_RULE, w.name, ""))
        return (f is not None and w.last_step is not None and bool(f.evidence.get("ongoing"))
                and f.first_step == w.last_step.step)

    @staticmethod
    def _run_status(statuses: list[RunStatus]) -> RunStatus:
        """One status for several workers: the most alarming wins; finished only when all are."""
        for s in ("crashed", "lost", "stalled", "running", "starting"):
            if s in statuses:
                return s
        if statuses and all(s in ("finished", "stopped") for s in statuses):
            return "stopped" if "stopped" in statuses else "finished"
        return "waiting"

    def set_input_figures(self, figures: InputFigures) -> None:
        """Input wait as the diagnostics engine measures it: the snapshot quotes these, and only
        these, so every view (header, panels, Workers, headless lines, report) shows the
        findings' numbers."""
        self._input = figures

    def snapshot(self, now: float | None = None) -> RunSnapshot:
        """An immutable view of the run at ``now`` (unix seconds; default: the clock)."""
        if now is None:
            now = self.clock()
        p = self._primary()
        if p is None:
            return RunSnapshot(now=now, status="waiting", messages=self.messages,
                               malformed=self.malformed, unknown=self.unknown,
                               truncated_tail=self.truncated_tail, recording_gaps=tuple(self._gaps),
                               events=tuple(self._events),
                               commands=tuple(self._commands.values()))
        workers = sorted(self._workers.values(),
                         key=lambda w: (w.topology.worker_index if w.topology else 1 << 30,
                                        w.order))
        statuses = {w.name: self._worker_status(w, now) for w in workers}
        status = self._run_status(list(statuses.values()))
        hello, topo, stats, last = p.hello, p.topology, p.stats, p.last_step
        roll = stats.rolling()
        cfg = self.telemetry.config

        total = cfg.get("total_steps")
        eta = None
        step = last.step if last else 0
        if isinstance(total, int) and step > total:
            total = None  # that fit is over: a later phase has no known end
        # During a stall no step comes: the rate is nought, not the one from before the hang.
        steps_per_s, examples_per_s = roll.steps_per_s, roll.examples_per_s
        if status == "stalled":
            steps_per_s = 0.0 if steps_per_s is not None else None
            examples_per_s = 0.0 if examples_per_s is not None else None
        if isinstance(total, int) and steps_per_s and status == "running":
            eta = max(0, total - step) / steps_per_s if steps_per_s > 0 else None

        # The cause, not a consequence: the earliest failing exit (peers of a dead worker fail after it).
        failed = [w.exit for w in workers if w.exit and w.exit.exit_code != 0]
        exit_msg = min(failed, key=lambda e: e.t) if failed else p.exit
        exc = next((w.exception for w in workers if w.exception), None)
        ended = None
        if status in ("finished", "stopped", "crashed") and any(w.exit for w in workers):
            ended = max(w.exit.t for w in workers if w.exit)
        elif status == "crashed" and exc is not None:
            ended = exc.t
        elif status == "lost":
            ended = max((w.last_t for w in workers if w.last_t is not None), default=None)

        devices: tuple[str, ...] = ()
        for w in workers:
            if w.topology:
                devices += w.topology.devices
        inp = self._input
        replica_losses = self._replica_losses(workers)

        return RunSnapshot(
            run_id=hello.run_id if hello else "",
            script=hello.script if hello else "",
            argv=hello.argv if hello else (),
            host=hello.host if hello else "",
            pid=hello.pid if hello else None,
            tf_version=hello.tf_version if hello else "",
            keras_version=str(cfg.get("keras_version") or (hello.keras_version if hello else "")),
            strategy=strategy_name(topo.strategy) if topo else "",
            strategies=tuple((strategy_name(t.strategy), t.replicas, n) for t, n in p.topologies),
            replicas=topo.replicas if topo else None,
            device_kind=topo.device_kind if topo else "",
            devices=devices,
            is_tpu=topo.is_tpu if topo else False,
            num_workers=max(topo.num_workers if topo else 1, len(workers)),
            mixed_precision=cfg.get("mixed_precision"),  # type: ignore[arg-type]
            global_batch_size=cfg.get("global_batch_size"),  # type: ignore[arg-type]
            per_replica_batch_size=cfg.get("per_replica_batch_size"),  # type: ignore[arg-type]
            steps_per_execution=cfg.get("steps_per_execution"),  # type: ignore[arg-type]
            total_steps=total,  # type: ignore[arg-type]
            epochs=cfg.get("epochs"),  # type: ignore[arg-type]
            status=status,
            exit_code=exit_msg.exit_code if exit_msg else None,
            exit_signal=exit_msg.signal if exit_msg else None,
            exception=f"{exc.type}: {exc.message}" if exc else None,
            exception_traceback=exc.traceback if exc else "",
            lost_reason=next((w.lost_reason for w in workers if w.lost_reason), None),
            started_t=self._started_t,
            ended_t=ended,
            now=now,
            last_message_t=self._last_t,
            step=step,
            epoch=self._epoch,
            epoch_logs=tuple(self._epoch_logs),
            last_step_t=last.t if last else None,
            step_time_s=last.step_time_s if last else None,
            step_p50_s=roll.step_p50_s,
            step_p95_s=roll.step_p95_s,
            step_window=stats.window_records,
            steps_per_s=steps_per_s,
            examples_per_s=examples_per_s,
            eta_s=eta,
            input_wait=inp.shown,
            input_scope=inp.scope,
            input_wait_frac=inp.shown.share if inp.shown else None,
            input_wait_frac_total=inp.run.share if inp.run else None,
            input_recent=inp.recent,
            input_run=inp.run,
            baseline=self.baseline,
            steps_total=stats.steps_total,
            loss=(mean_loss([r.loss for r in replica_losses]) if len(workers) > 1
                  else p.last_losses.loss if p.last_losses else None),
            loss_step=max((r.step for r in replica_losses), default=None),
            replica_losses=replica_losses,
            history=stats.history.points(),
            history_records_per_point=stats.history.records_per_point,
            functions=tuple(sorted(self._functions.values(), key=lambda f: (-f.traces, f.label))),
            retraces=tuple(self._retraces),
            pipelines=tuple(self._pipelines),
            device_memory=self._device_memory(),
            device_peaks=tuple((k[0], k[1], v) for k, v in sorted(self._device_peaks.items())),
            host_memory=tuple(HostMemory(worker=w.name, rss_bytes=w.host.rss_bytes,
                             available_bytes=w.host.available_bytes,
                             total_bytes=w.host.total_bytes, cpu_percent=w.host.cpu_percent,
                             t=w.host.t, load_1m=w.host.load_1m) for w in workers if w.host is not None),
            host_history=next((tuple(w.host_history) for w in workers if w.host_history), ()),
            device_memory_notes=tuple(f"{d}: {why}" for d, why in sorted(self._device_mem_notes.items())),
            host_rss_peak_bytes=max((w.rss_peak for w in workers), default=0) or None,
            tpu_metrics_note=self._tpu_note,
            phase=p.phase.phase if p.phase else "",
            phase_since=p.phase.since if p.phase else None,
            phase_detail=p.phase.detail if p.phase else "",
            ledger=self._ledger(workers, now, status in ("running", "stalled", "starting")),
            events=tuple(self._events),
            commands=tuple(self._commands.values()),
            findings=tuple(self._findings.values()),
            workers=tuple(self._worker_view(w, statuses[w.name], roll if w is p else None)
                          for w in workers),
            disabled_probes=dict(self._disabled),
            messages=self.messages,
            malformed=self.malformed,
            unknown=self.unknown,
            truncated_tail=self.truncated_tail, recording_gaps=tuple(self._gaps),
        )

    def _device_memory(self) -> tuple[DeviceMemory, ...]:
        """Every device's newest sample as shown, by worker and device name."""
        if len(self._device_order) != len(self._devices):  # a new device (none ever leaves)
            self._device_order = sorted(self._devices)
        views = self._device_views
        out = []
        for key in self._device_order:
            msg = self._devices[key]
            seen = views.get(key)
            if seen is None or seen[0] is not msg:
                seen = views[key] = (msg, _device_memory(key[0], msg))
            out.append(seen[1])
        return tuple(out)

    def _replica_losses(self, workers: list[Worker]) -> tuple[ReplicaLoss, ...]:
        rows: list[tuple[int, str, str, float, int]] = []
        for w in workers:
            m = w.last_losses
            if m is None:
                continue
            topo = w.topology
            base = topo.worker_index * topo.local_replicas if topo else 0
            devs = topo.devices if topo else ()
            for i, v in enumerate(m.replica_losses):
                rows.append((base + i, devs[i] if i < len(devs) else "", w.name, v, m.step))
        # each replica's deviation from the finite replicas' mean (a NaN replica is flagged, and
        # must not make every other deviation NaN)
        mean = mean_loss([r[3] for r in rows if math.isfinite(r[3])])
        if mean is None:
            mean = math.nan
        return tuple(
            ReplicaLoss(index=i, device=d, worker=wn, loss=v,
                        deviation=(v - mean) if math.isfinite(v) else math.nan,
                        finite=math.isfinite(v), step=s)
            for i, d, wn, v, s in sorted(rows))

    def _worker_view(self, w: Worker, status: RunStatus, roll: Rolling | None) -> WorkerView:
        if roll is None:
            roll = w.stats.rolling()
        p50 = roll.step_p50_s
        if w.from_summary and w.summary is not None:
            p50 = w.summary.step_time_p50_s  # its newest summary's interval (about a second)
        hello = w.hello
        wait, wait_scope = self._input.of_worker(w.name)
        return WorkerView(
            name=w.name,
            host=hello.host if hello else "",
            pid=hello.pid if hello else 0,
            status=status,
            step=w.last_step.step if w.last_step else 0,
            last_step_t=w.last_step.t if w.last_step else None,
            step_p50_s=p50,
            input_wait_frac=wait.share if wait else None,
            input_scope=wait_scope,
            rss_bytes=w.host.rss_bytes if w.host else None,
            connected=w.connected,
            exit_code=w.exit.exit_code if w.exit else None,
            exit_signal=w.exit.signal if w.exit else None,
            summary=w.from_summary,
        )


def _device_memory(worker: str, msg: DeviceSample) -> DeviceMemory:
    return DeviceMemory(
        device=msg.device, worker=worker, current_bytes=msg.current_bytes, peak_bytes=msg.peak_bytes,
        limit_bytes=msg.limit_bytes, source=msg.source, limit_source=msg.limit_source,
        duty_cycle_pct=msg.duty_cycle_pct, t=msg.t)


def _fmt_scalar(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)

"""The tpuwatch dashboard: one Textual app for live runs, attach and replay.

Data flow: a reader thread (:class:`~tpuwatch.ui.source_reader.SourceReader` in a
Textual worker) drains the *source* at a fixed rate (default 4 Hz), applies every new message to
one ``RunState`` it alone owns, evaluates the findings, tails output.log, and hands the UI one
immutable :class:`~tpuwatch.ui.source_reader.Frame`; the UI sets the frame's ``RunSnapshot`` on
the app when the :class:`~tpuwatch.ui.pacer.Pacer` said it is worth drawing (news at once,
numbers once a second); every panel is bound to that reactive and renders from it. Rendering
cost is per frame, not per message, which is what keeps up with thousands of steps per second,
and no read, decode or apply runs on the UI thread. Errors of every worker reach one place
(:meth:`TpuwatchApp.on_worker_state_changed`: a toast and a line in the Events panel).

Entry points for the CLI: :func:`run_dashboard`, :func:`tpuwatch.sources.file_source.make_file_source`,
:func:`tpuwatch.sources.replay_source.make_replay_source`.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import threading
import time
from functools import partial
from pathlib import Path
from typing import Callable, Iterable, Literal, Mapping

from textual import events, work
from textual.actions import parse
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.command import CommandPalette
from textual.containers import Grid, Horizontal
from textual.message import Message
from textual.notifications import SeverityLevel
from textual.reactive import reactive
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Input
from textual.worker import Worker, WorkerState, get_current_worker

from tpuwatch.monitor.baseline import Baseline
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.monitor.state import RunState
from tpuwatch.printable import printable
from tpuwatch.protocol import Command, Event, Result, StackDump
from tpuwatch.sources.source import ReplayControl, Source
from tpuwatch.ui.hangup_driver import hangup_safe
from tpuwatch.ui.pacer import SHOW_PERIOD_S
from tpuwatch.ui.replay_output import epoch_anchors, visible_lines
from tpuwatch.ui.screens.help_screen import HelpScreen
from tpuwatch.ui.screens.profile_summary_screen import (
    ProfileSummaryScreen,
    load_summary_text,
    new_profile_results,
)
from tpuwatch.ui.screens.quit_screen import QuitScreen
from tpuwatch.ui.screens.results_screen import ResultsScreen
from tpuwatch.ui.screens.stack_screen import StackScreen, stall_stacks
from tpuwatch.ui.screens.text_screen import TextScreen
from tpuwatch.ui.source_reader import Frame, SourceReader
from tpuwatch.ui.widgets.command_line import CommandLine, command_summary
from tpuwatch.ui.widgets.event_panel import EventPanel
from tpuwatch.ui.widgets.findings_panel import FindingsPanel
from tpuwatch.ui.widgets.goodput_panel import GoodputPanel
from tpuwatch.ui.widgets.input_panel import WAIT_LEGEND, InputPanel
from tpuwatch.ui.widgets.memory_panel import MemoryPanel
from tpuwatch.ui.widgets.output_panel import OutputPanel
from tpuwatch.ui.widgets.panel import Panel
from tpuwatch.ui.widgets.replay_bar import ReplayBar, ReplayState
from tpuwatch.ui.widgets.replica_loss_panel import ReplicaLossPanel, scale_title
from tpuwatch.ui.widgets.retrace_panel import RetracePanel
from tpuwatch.ui.widgets.run_header import RunHeader, problem_text
from tpuwatch.ui.widgets.step_time_panel import StepTimePanel
from tpuwatch.ui.widgets.workers_panel import WorkersPanel
from tpuwatch.units import finding_duration

DashboardResult = Literal["stop", "detach", "quit"]

#: Default refresh rate of the dashboard (Hz).
REFRESH_HZ = 4.0
#: How long the app, once it has ended, waits for a read in progress before the source is closed.
READER_STOP_S = 2.0
#: Results this much older than the dashboard's opening are not announced (clock skew margin, s).
TOAST_SLACK_S = 2.0
#: Statuses during which quitting asks whether to stop training.
ACTIVE = ("waiting", "starting", "running", "stalled")
#: A command the agent has not taken (queued, running or answered) this long after it was sent was
#: skipped: the agent skips commands past the budget all viewers share (5 a second, bursts of 20),
#: without a result. Its key is free again and the dashboard says so; the agent acknowledges a
#: command it takes within a sample period, however long the command then runs.
COMMAND_ACK_S = 20.0
#: Actions that run inside training and take a command id.
COMMAND_ACTIONS = ("profile", "checkpoint")
#: Statuses after which no training process is left to ask or to leave running.
ENDED = ("finished", "stopped", "crashed")
#: Actions that need the training process: hidden once it ended (a key pressed says why).
LIVE_ACTIONS = (*COMMAND_ACTIONS, "stacks", "detach")

#: Panels in the order the number keys (1..9) jump to them.
#: The panels the number keys jump to: ``1`` ... ``9``, then ``0`` (Workers, with two or more workers).
PANEL_IDS = ("step-time", "loss", "memory", "findings", "input", "retraces", "events", "output-log", "goodput",
             "workers")


def panel_key(index: int) -> str:
    """The number key of ``PANEL_IDS[index]`` (the tenth is ``0``)."""
    return str((index + 1) % 10)



class TpuwatchApp(App[str]):
    """The dashboard. ``source`` feeds it (see :mod:`tpuwatch.sources.source`); ``run_dir`` is where
    output.log is tailed from (``None``: no output panel content).

    ``clock`` (unix seconds) stamps live snapshots; ``refresh_hz=0`` turns the reader thread off,
    for tests that drive :meth:`pull` themselves (each pull then reads on the calling thread,
    and every pull is shown). With it on, the source is drained ``refresh_hz`` times a second
    on the reader thread but a snapshot is shown only when :class:`~tpuwatch.ui.pacer.Pacer`
    says so (news at once, numbers once a second).
    """

    class FrameRead(Message):
        """The reader thread's latest frame, for the UI thread."""

        def __init__(self, frame: Frame) -> None:
            super().__init__()
            self.frame = frame

    CSS_PATH = "tpuwatch.tcss"
    TITLE = "tpuwatch"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    # ctrl+p opens the palette; the palette lists the same actions as the keys.
    BINDINGS = [
        Binding("p", "profile", "Profile", id="profile",
                tooltip="Profile the next steps (XProf / TensorBoard)"),
        Binding("c", "checkpoint", "Checkpoint", id="checkpoint",
                tooltip="Save a checkpoint at the next step boundary"),
        Binding("o", "toggle_output", "Output", id="output", tooltip="Maximise / restore the output log"),
        Binding("f", "fold_native", "Fold TF logs", id="fold", show=False,
                tooltip="Fold / unfold TensorFlow's C++ log lines in the output"),
        Binding("slash", "search_output", "Search", id="search", tooltip="Search the output log", show=False),
        Binding("d", "detach", "Detach", id="detach", tooltip="Leave; training keeps running"),
        Binding("s", "stacks", "Stacks", id="stacks", show=False,
                tooltip="Show every thread's stack of the training process (a stalled or hung run)"),
        Binding("z,enter", "expand", "Expand", id="expand", show=False,
                tooltip="Expand the focused panel to the whole screen (it scrolls); again to restore"),
        # Shown in the footer only while a panel is expanded or the output maximised: the way back.
        Binding("escape", "restore", "Back", id="restore",
                tooltip="Put an expanded panel or the maximised output back (q, z too)"),
        Binding("l", "loss_scale", "Loss scale", id="loss_scale", show=False,
                tooltip="Loss chart: recent window, log scale, whole run"),
        Binding("r", "results", "Results", id="results", show=False,
                tooltip="Every command's result (profiles, checkpoints, stacks) with full paths"),
        Binding("question_mark", "help", "Help", id="help", tooltip="This help"),
        Binding("q", "request_quit", "Quit", id="quit", tooltip="Quit (asks first while training runs)"),
        Binding("space", "toggle_pause", "Pause", id="replay.pause", show=False, priority=True,
                tooltip="Replay: pause / play"),
        Binding("plus,equals_sign", "faster", "Faster", id="replay.faster", show=False, priority=True,
                tooltip="Replay: faster"),
        Binding("minus", "slower", "Slower", id="replay.slower", show=False, priority=True,
                tooltip="Replay: slower"),
        Binding("left", "seek(-1)", "Back", id="replay.back", show=False, priority=True,
                tooltip="Replay: back 5% of the recording (20 presses cross it)"),
        Binding("right", "seek(1)", "Forward", id="replay.forward", show=False, priority=True,
                tooltip="Replay: forward 5% of the recording"),
        Binding("home", "seek_start", "Start", id="replay.start", show=False, priority=True,
                tooltip="Replay: jump to the start"),
        Binding("end", "seek_end", "End", id="replay.end", show=False, priority=True,
                tooltip="Replay: jump to the end"),
        *(
            Binding(panel_key(i), f"focus_panel({i})", f"Panel {panel_key(i)}", id=f"panel.{panel_key(i)}",
                    show=False)
            for i in range(len(PANEL_IDS))
        ),
    ]

    # The app itself never repaints on a new snapshot: each widget repaints what changed.
    snapshot: reactive[RunSnapshot] = reactive(RunSnapshot, always_update=True, repaint=False)

    def __init__(
        self,
        source: Source,
        *,
        run_dir: Path | None = None,
        title: str | None = None,
        clock: Callable[[], float] = time.time,
        refresh_hz: float = REFRESH_HZ,
        keymap: Mapping[str, str] | None = None,
        handle_hangup: bool = False,
        record_findings: bool = False,
        baseline: Baseline | None = None,
    ) -> None:
        super().__init__()
        self._handle_hangup = handle_hangup
        #: Set when the terminal hung up (SSH dropped): the caller treats it as a detach.
        self.hung_up = False
        self.source = source
        self.run_dir = Path(run_dir) if run_dir is not None else None
        if title:
            self.title = title
        self._clock = clock
        self._refresh_hz = refresh_hz
        self._replay_key: tuple = ()
        self._replay: ReplayControl | None = source if isinstance(source, ReplayControl) else None
        # Record new findings: only the process that owns the run does.
        self._reader = SourceReader(source, clock=clock, show_period_s=SHOW_PERIOD_S if refresh_hz > 0 else 0.0,
                                    run_dir=self.run_dir, record_findings=record_findings, baseline=baseline)
        #: The reader thread runs (refresh_hz > 0, mounted); otherwise pull() reads on its caller's thread.
        self._threaded = False
        self._wake = threading.Event()  # a pull asks the reader thread to read now
        self._frame_shown = threading.Event()  # the UI took the last frame: the reader may read on
        self._reader_stop = threading.Event()
        self._read_lock = threading.Lock()  # held by the reader thread while it reads
        self._stack_dumps: tuple[StackDump, ...] = ()
        self._worker_errors: set[str] = set()  # worker failures already surfaced
        self._sent: dict[str, str] = {}  # action -> id of the command still in flight
        self._sent_ids: set[str] = set()  # every command this dashboard sent
        self._sent_t: dict[str, float] = {}  # id -> when it was sent, until the agent takes it
        self._profiles_shown: set[str] = set()
        self._toasted: set[str] | None = None  # ids of ended commands already announced
        self._focus_before_expand: Widget | None = None  # the focus before a panel was expanded
        self._replay_lines: tuple[str, ...] | None = None  # a replay's whole output, read once
        self._replay_anchors: list[int] = []
        self._replay_shown = 0
        self._opened_t = clock()  # results older than this were in the recording already
        self._binding_key: tuple = ()
        self._source_error = ""
        self._keymap = dict(keymap or {})

    @property
    def _state(self) -> RunState:
        """The reader's run state. Only the reader's thread may touch it: tests that drive
        :meth:`pull` themselves (``refresh_hz=0``), where that is the UI thread."""
        return self._reader.state

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """A toast, as plain text unless asked otherwise: toasts carry paths, messages and names
        from the run, and Textual would read ``[/]`` in them as markup (an error that ended the
        dashboard) and ``[lr=0.1]`` as a style (silently eaten); their control characters are
        shown escaped."""
        super().notify(printable(message), title=title, severity=severity, timeout=timeout, markup=markup)

    # --- layout ----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield RunHeader(id="header").data_bind(TpuwatchApp.snapshot)
        # Held: the refresh timer may fire while the screen is torn down, when a query fails.
        self._command_line = CommandLine(self.run_dir, id="commands")
        yield self._command_line.data_bind(TpuwatchApp.snapshot)
        if self._replay is not None:
            yield ReplayBar(id="replay")
        with Grid(id="panels"):
            yield StepTimePanel(id="step-time").data_bind(TpuwatchApp.snapshot)
            yield ReplicaLossPanel(id="loss").data_bind(TpuwatchApp.snapshot)
            yield MemoryPanel(id="memory").data_bind(TpuwatchApp.snapshot)
            yield FindingsPanel(id="findings").data_bind(TpuwatchApp.snapshot)
            yield InputPanel(id="input").data_bind(TpuwatchApp.snapshot)
            yield RetracePanel(id="retraces").data_bind(TpuwatchApp.snapshot)
            yield WorkersPanel(id="workers").data_bind(TpuwatchApp.snapshot)  # shown with 2+ workers
        with Horizontal(id="bottom"):
            # a replay's arrows seek: they cannot scroll a cut line
            yield OutputPanel(id="output", arrows_scroll=self._replay is None)
            yield EventPanel(id="events").data_bind(TpuwatchApp.snapshot)
            yield GoodputPanel(id="goodput").data_bind(TpuwatchApp.snapshot)
        # The palette key is listed in the help screen: the footer's room goes to our keys.
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        if self._keymap:
            self.set_keymap(self._keymap)
        if self._refresh_hz > 0:
            self._threaded = True
            self._read_loop()  # its first read at once
        else:
            self.pull()
        if self._handle_hangup and hasattr(signal, "SIGHUP"):
            # Without this a dropped SSH session kills the viewer mid-frame; training lives in
            # its own session either way, but the caller should learn it was a detach.
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._hangup)

    def on_unmount(self) -> None:
        self._reader_stop.set()
        if self._handle_hangup and hasattr(signal, "SIGHUP"):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)

    def _hangup(self) -> None:
        self.hung_up = True
        self.exit("detach")

    # --- data ------------------------------------------------------------------------------

    def pull(self) -> None:
        """Reads the source and shows what came: at once on this thread with the reader thread
        off (``refresh_hz=0``); otherwise the reader thread is woken to read now."""
        if self._threaded:
            self._wake.set()
        else:
            self._show_frame(self._reader.read())

    @work(thread=True, group="reader", name="reading the run", exit_on_error=False)
    def _read_loop(self) -> None:
        """The reader thread: one read every 1/refresh_hz s (at once when woken), each frame
        handed to the UI thread, the next read only once the UI took it."""
        worker = get_current_worker()
        period = 1.0 / self._refresh_hz
        while True:
            started = time.monotonic()
            self._wake.clear()
            with self._read_lock:
                if worker.is_cancelled or self._reader_stop.is_set():
                    return
                frame = self._reader.read()
            self._frame_shown.clear()
            if not self.post_message(self.FrameRead(frame)):
                return  # the app is closing
            while not self._frame_shown.wait(0.1):
                if worker.is_cancelled or self._reader_stop.is_set():
                    return
            self._wake.wait(max(0.0, started + period - time.monotonic()))

    def on_tpuwatch_app_frame_read(self, message: FrameRead) -> None:
        try:
            if self.screen_stack and not self._reader_stop.is_set():  # not while closing
                self._show_frame(message.frame)
        finally:
            self._frame_shown.set()

    def stop_reading(self, timeout: float = READER_STOP_S) -> None:
        """Stops the reader thread and waits (at most ``timeout`` s) for a read in progress, so
        that the source can be closed under it."""
        self._reader_stop.set()
        self._wake.set()
        if self._read_lock.acquire(timeout=timeout):
            self._read_lock.release()

    def _show_frame(self, frame: Frame) -> None:
        """The UI thread's part of a refresh: the frame's snapshot, output and replay position."""
        for error in frame.errors:
            self._report_source_error(error)
        self._stack_dumps = frame.stack_dumps
        shown = frame.snapshot is not None
        if frame.snapshot is not None:
            self.snapshot = frame.snapshot
        self._command_line.tick(frame.now)
        for done in new_profile_results(self.snapshot, self._profiles_shown, ids=self._sent_ids):
            self._show_profile(done, self.snapshot.input_recent)
        self._toast_results()
        if isinstance(self.screen, TextScreen):
            self.screen.show(self.snapshot)
        if frame.replay_output_too_long:
            # Too long to hold: its end, as a live view shows it, and the panel says so.
            self.query_one(OutputPanel).border_title = f"{OutputPanel.TITLE} (its end: too long to follow the replay)"
        if frame.replay_output is not None:
            self._replay_lines = frame.replay_output
            self._replay_anchors = epoch_anchors(frame.replay_output)
            if frame.replay_output and not self._replay_anchors:
                self.query_one(OutputPanel).border_title = f"{OutputPanel.TITLE} (replay position approximate)"
        replay = frame.replay
        if replay is not None and self._replay_lines is not None:
            self._replay_output(replay)
        if frame.output:
            self.query_one(OutputPanel).append(list(frame.output))
        replay_key = (replay.paused, replay.speed, replay.at_end) if replay is not None else ()
        if replay is not None and (shown or replay_key != self._replay_key):
            self._replay_key = replay_key
            self.query_one(ReplayBar).state = replay
        self._expire_untaken()
        self._refresh_bindings_if_changed()

    def _expire_untaken(self) -> None:
        """Frees the key of a command the agent never took (see ``COMMAND_ACK_S``)."""
        if not self._sent_t:
            return
        now = self._clock()
        taken = {c.id for c in self.snapshot.commands if c.status != "pending"}
        for cid, sent_t in list(self._sent_t.items()):
            if cid in taken:
                del self._sent_t[cid]
            elif now - sent_t >= COMMAND_ACK_S:
                del self._sent_t[cid]
                action = next((a for a, i in self._sent.items() if i == cid), None)
                if action is None:
                    continue
                del self._sent[action]
                message = (f"no answer from the agent in {COMMAND_ACK_S:g} s (it skips commands past 5 a "
                           "second from all viewers together, without one): the key is free again")
                self._reader.apply_local(partial(_untaken_result, cid, action, message))
                self.notify(f"{action}: {message}", severity="warning", timeout=8)
                self.pull()

    def _replay_output(self, replay: ReplayState) -> None:
        """Keeps the Output panel in step with the replay position (see replay_output.py)."""
        assert self._replay_lines is not None
        s = self.snapshot
        span = replay.duration_s
        fraction = replay.position_s / span if span > 0 else 1.0
        ended = replay.at_end or s.status in ("finished", "stopped", "crashed", "lost")
        begun = 0 if s.epoch is None else s.epoch + 1
        ended_epochs = s.epoch_logs[-1][0] + 1 if s.epoch_logs else 0
        n = visible_lines(len(self._replay_lines), self._replay_anchors, begun, ended_epochs, fraction, ended)
        panel = self.query_one(OutputPanel)
        if n < self._replay_shown:  # seeking back: start over
            panel.log_view.clear()
            self._replay_shown = 0
        if n > self._replay_shown:
            panel.append(list(self._replay_lines[self._replay_shown:n]))
            self._replay_shown = n

    def _toast_results(self) -> None:
        """A toast for each command that ended while the dashboard was open: its result is seen
        whatever the width (results already in the recording when it opened, or reached by
        seeking a replay, are in the command lines and the results screen instead)."""
        ended = [c for c in self.snapshot.commands if c.status in ("done", "failed")]
        if self._toasted is None or self._replay is not None:
            self._toasted = {c.id for c in ended}
            return
        for c in ended:
            if c.id in self._toasted:
                continue
            self._toasted.add(c.id)
            if c.id not in self._sent_ids and c.t < self._opened_t - TOAST_SLACK_S:
                continue  # caught up from the recording (a long one takes several refreshes)
            if c.status == "done" and c.action == "profile" and c.id in self._sent_ids:
                continue  # its summary opens by itself and names it (a toast covered its last lines)
            if c.action == "stack_dump" and isinstance(self.screen, StackScreen):
                continue  # the stacks window open on top shows it (a toast covered the stacks)
            text = command_summary(c, self.run_dir).plain
            if c.status == "failed":
                self.notify(text, severity="error", timeout=12)
            else:
                self.notify(text + "  (r: all results)", timeout=8)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place a worker's failure surfaces (each runs with ``exit_on_error=False``):
        a toast and a line in the Events panel, once per distinct error."""
        if event.state != WorkerState.ERROR:
            return
        error = event.worker.error
        text = f"{event.worker.name or event.worker.group} failed: {type(error).__name__}: {error}"
        if text in self._worker_errors:
            return
        self._worker_errors.add(text)
        self.notify(text, severity="error", timeout=12)
        if event.worker.group == "reader":
            # The reader thread is gone: its state is the UI thread's now, read at the refresh
            # rate as tests' pull() does (a second failure ends the dashboard, as any error in it).
            self._threaded = False
            self.set_interval(1.0 / self._refresh_hz, self.pull, name="refresh")
        self._reader.apply_local(lambda now: Event(t=now, level="error", source="viewer", message=text))
        self.pull()

    def _report_source_error(self, message: str) -> None:
        if message != self._source_error:  # once per distinct error, not 4 times a second
            self._source_error = message
            self.notify(message, severity="error", timeout=10)

    def _busy(self, action: str) -> bool:
        """A command of this kind is in flight (sent, queued or running)."""
        if action in self._sent:
            sent_id = self._sent[action]
            for c in self.snapshot.commands:
                if c.id == sent_id and c.status in ("done", "failed"):
                    del self._sent[action]
                    break
        if action in self._sent:
            return True
        return any(c.action == action and c.status in ("pending", "queued", "running") for c in self.snapshot.commands)

    def _run_active(self) -> bool:
        # Nothing readable came and something is wrong (refused, unreachable, not a recording):
        # there is no run to stop, and offering to would be a lie.
        return self.source.live and self.snapshot.status in ACTIVE and not problem_text(self.snapshot)

    def _refresh_bindings_if_changed(self) -> None:
        key = (self._run_active(), *(self._busy(a) for a in COMMAND_ACTIONS))
        if key != self._binding_key:
            self._binding_key = key
            self.refresh_bindings()

    # --- actions ---------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "restore":
            return self._zoomed()
        if action == "focus_panel" and parameters and PANEL_IDS[int(str(parameters[0]))] == "workers":
            return len(self.snapshot.workers) > 1  # the panel is shown with two or more workers only
        if action in ("expand", "loss_scale", "fold_native") and len(self._under_palette()) > 1:
            return False  # they act on the dashboard's panels, not on a dialog or list on top
        if action in (*COMMAND_ACTIONS, "stacks") and self._replay is not None:
            return False  # a recording cannot be asked for anything: hidden, not just dimmed
        if action in LIVE_ACTIONS and self._ended():
            return False  # nothing left to ask or to leave running: hidden, see on_key
        if action in COMMAND_ACTIONS:
            # Shown but dimmed when it cannot run now: the key exists, the run cannot take it.
            if not (self.source.can_send and self._run_active()) or self._busy(action):
                return None
            return True
        if action == "detach":
            return True if self.source.live else False
        if action == "stacks":
            return True if self.source.can_send and self._run_active() else None
        if action in ("toggle_pause", "faster", "slower", "seek", "seek_start", "seek_end"):
            # Hidden outside a replay; and while typing a search, arrows and space are text.
            return self._replay is not None and not isinstance(self.focused, Input)
        return True

    def _ended(self) -> bool:
        return self.source.live and self._replay is None and self.snapshot.status in ENDED

    def on_key(self, event: events.Key) -> None:
        """A key of an action hidden because the run ended reaches here unhandled: say why."""
        if not self._ended():
            return
        for b in self._key_bindings().get(event.key, ()):
            if b.action.split("(")[0] in LIVE_ACTIONS:
                event.stop()
                # One toast line at 80 columns: "Checkpoint: the run has finished".
                self.notify(f"{b.description}: the run has {self.snapshot.status}", timeout=5)
                return

    def action_profile(self) -> None:
        self._send("profile")

    def action_checkpoint(self) -> None:
        self._send("checkpoint")

    def action_stacks(self) -> None:
        if isinstance(self.screen, StackScreen):
            return
        from tpuwatch.control.stack_request import StackRequest

        dumps = lambda: self._stack_dumps  # noqa: E731  # the latest frame's
        stall = stall_stacks(self.snapshot, dumps())
        if stall is not None:  # the stall going on: the stacks the agent took when it began
            note = (f"stacks the agent took {finding_duration(stall.gap_s or 0.0)} into the stall after step "
                    f"{stall.step}, written to {stall.path}")
            self.push_screen(StackScreen(StackRequest.taken(stall, note), lambda: (self.snapshot.commands, dumps())))
            return
        before = dumps()
        self._send("stack_dump")
        snap = self.snapshot
        request = StackRequest(self._sent["stack_dump"], run_dir=self.run_dir, pid=snap.pid, host=snap.host)
        request.remember_existing(before)
        self.push_screen(StackScreen(request, lambda: (self.snapshot.commands, dumps())))

    def action_loss_scale(self) -> None:
        panel = self.query_one(ReplicaLossPanel)
        if not panel.query_one("#loss-bars").region.area:
            # No room for the chart (80x24, or the output maximised): a scale change would show
            # nothing, so the key shows the chart, expanded; l again changes its scale.
            if self.screen.has_class("-output-max"):
                self.action_toggle_output()
            self._restore_panels()
            self._expand(panel)
            self.notify("loss chart, expanded: z puts it back", timeout=3)  # its scale: on its border
            return
        scale = panel.next_scale()
        self.notify(f"loss chart: {scale_title(scale, self.snapshot).split(' · ')[0]}", timeout=2)

    def action_results(self) -> None:
        if not isinstance(self.screen, TextScreen):
            self.push_screen(ResultsScreen(self.snapshot))

    def _send(self, action: str) -> None:
        command = Command(id=f"{action}-{secrets.token_hex(4)}", action=action)
        self._sent[action] = command.id
        self._sent_ids.add(command.id)
        self._sent_t[command.id] = self._clock()
        self._reader.apply_local(lambda now: command)  # shows as "pending" until the agent answers
        self.pull()
        self._deliver(command)

    @work(thread=True, group="profile-summary", name="loading the profile summary", exit_on_error=False)
    def _show_profile(self, command, live) -> None:
        # xprof takes up to ~0.3 s: never on the UI thread.
        text = load_summary_text(command, live, width=ProfileSummaryScreen.text_width(self.size.width))
        self.call_from_thread(self.push_screen, ProfileSummaryScreen(text))

    @work(thread=True, group="commands", name="sending a command", exit_on_error=False)
    def _deliver(self, command: Command) -> None:
        # Connecting to the agent may take up to its connect timeout: never on the UI thread.
        try:
            self.source.send(command)
        except OSError as e:
            self.call_from_thread(self._send_failed, command, str(e) or type(e).__name__)

    def _send_failed(self, command: Command, reason: str) -> None:
        self._sent.pop(command.action, None)
        self._sent_t.pop(command.id, None)
        self._reader.apply_local(lambda now: Result(t=now, id=command.id, action=command.action, ok=False,
                                                    message=f"not sent: {reason}"))
        self.notify(f"{command.action}: {reason}", severity="error", timeout=8)
        self.pull()

    def action_detach(self) -> None:
        self.exit("detach")

    def action_request_quit(self) -> None:
        if isinstance(self.screen, (QuitScreen, HelpScreen)):
            return
        if self._zoomed():  # q closes what is open first, as it does every pop-up
            self.action_restore()
            return
        if not self._run_active():
            self.exit("quit")
            return

        def chosen(choice: str | None) -> None:
            if choice in ("stop", "detach"):
                self.exit(choice)

        self.push_screen(QuitScreen(), chosen)

    async def action_quit(self) -> None:
        # ctrl+q (Textual's own quit key) must ask too: never stop training by accident.
        self.action_request_quit()

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        self.push_screen(HelpScreen(self.key_rows()))

    def _key_bindings(self) -> dict[str, list[Binding]]:
        """The app's keys as the keymap maps them (``_bindings`` holds the defaults: the help
        listed ``?`` for a help remapped to f1)."""
        bindings = self._bindings.copy()
        if self._keymap:
            bindings.apply_keymap(self._keymap)
        return bindings.key_to_bindings

    def key_rows(self) -> list[tuple[str, str, bool]]:
        """(keys as currently mapped, description, enabled now) for the help screen."""
        rows: list[tuple[str, str, bool]] = []
        seen: set[str] = set()
        key_bindings = self._key_bindings()
        for bindings in key_bindings.values():
            for b in bindings:
                if b.id is None or b.id.startswith("panel.") or b.id in seen:
                    continue
                seen.add(b.id)
                action = b.action.split("(")[0]
                enabled = self.check_action(action, ())
                if enabled is False and action not in (*COMMAND_ACTIONS, "detach", "restore"):
                    continue
                keys = ", ".join(
                    self.get_key_display(x)
                    for k, bs in key_bindings.items()
                    for x in bs
                    if x.id == b.id
                )
                # esc is hidden from the footer until something is expanded, never off.
                rows.append((keys, b.tooltip or b.description, bool(enabled) or action == "restore"))
        rows.append(("1 … 9, 0", "Jump to a panel (step, loss, memory, findings, …, goodput; 0 workers)", True))
        rows.append(("tab, shift+tab", "Next / previous panel", True))
        rows.append(("n, N", "Next / previous search match (output)", True))
        rows.append(("[ ] v (Workers)", "Select a worker; v: its every record instead of summaries (many hosts)",
                     True))
        # Glyphs, so none is unexplained (the expanded Step time panel says the same).
        rows.append(("▲ (chart)", "Step time: the first step (tracing, compiling), above the scale", True))
        rows.append(("w (chart)", "Step time, Input: " + WAIT_LEGEND.removeprefix("w: "), True))
        rows.append(("!!, !, i", "Findings: critical, warning, information", True))
        return rows

    def action_focus_panel(self, index: int) -> None:
        widget = self.query_one(f"#{PANEL_IDS[index]}")
        restored = self._restore_panels()
        if self.screen.has_class("-output-max") and PANEL_IDS[index] != "output-log":
            self.action_toggle_output()
            restored = True
        if restored:
            # The panels come back at the next layout: until then each has no area and would
            # read as "no room at this size".
            self.call_after_refresh(self.action_focus_panel, index)
            return
        if isinstance(widget, Panel) and (not widget.display or not widget.region.area):
            # Hidden at this size (80x24 has no room for it): shown expanded instead.
            self._expand(widget)
            return
        widget.focus()

    def action_zoom_worker(self) -> None:
        """The Workers panel's selected worker sends every record instead of summaries."""
        name = self.query_one(WorkersPanel).selected_worker()
        zoom = getattr(self.source, "zoom", None)
        if name is None or zoom is None:
            self.notify("every worker already sends every record (summaries are for HOST:PORT viewers of many "
                        "hosts)", severity="warning")
        elif zoom(name):
            self.notify(f"{name}: every record from now on (its history before stays summaries; "
                        f"`tpuwatch attach` of that host alone shows it all)")
        else:
            self.notify(f"{name} already sends every record", severity="warning")

    def action_expand(self) -> None:
        """The focused panel takes the whole screen and scrolls (the Retraces panel then lists
        every retrace); on the output, maximises it."""
        focused = self.focused
        panel = next((w for w in (focused, *(focused.ancestors if focused else ())) if isinstance(w, Panel)), None)
        if self._restore_panels():
            return
        if panel is None:
            if focused is not None and self.query_one(OutputPanel) in focused.ancestors:
                self.action_toggle_output()
            return
        self._expand(panel)

    def _expand(self, panel: Panel) -> None:
        if self.focused is not None and panel not in (self.focused, *self.focused.ancestors):
            self._focus_before_expand = self.focused  # where esc gives the focus back
        self.screen.add_class("-panel-max")
        self.screen.set_class(panel.parent is self.query_one("#bottom"), "-max-bottom")
        panel.add_class("-maximised")
        panel.focus()
        panel.call_after_refresh(panel.watch_snapshot, panel.snapshot)
        self.refresh_bindings()  # the footer shows the way back

    def _restore_panels(self) -> bool:
        """Puts an expanded panel back; False when none was."""
        expanded = list(self.query(".-maximised"))
        for w in expanded:
            w.remove_class("-maximised")
            w.call_after_refresh(w.watch_snapshot, w.snapshot)  # type: ignore[attr-defined]  # a Panel
        self.screen.remove_class("-panel-max", "-max-bottom")
        if expanded:
            self.refresh_bindings()
            self.call_after_refresh(self._refocus)
        return bool(expanded)

    def _refocus(self) -> None:
        """After a panel is put back: a panel with no room at this size (shown expanded by its
        number key) cannot keep the focus, so it goes back where it was before."""
        focused = self.focused
        if focused is not None and focused.region.area:
            return
        before = self._focus_before_expand
        if before is not None and before.is_attached and before.region.area:
            before.focus()
        else:
            next((p for p in self.query(Panel) if p.region.area), self.query_one(Panel)).focus()

    def _zoomed(self) -> bool:
        """A panel expanded or the output maximised: esc (and q) put it back."""
        stack = self._under_palette()
        return len(stack) == 1 and (stack[0].has_class("-panel-max") or stack[0].has_class("-output-max"))

    def _under_palette(self) -> list[Screen]:
        """The screen stack without the command palette: what the palette offers is what the
        screen under it can do."""
        return [s for s in self.screen_stack if not isinstance(s, CommandPalette)]

    def action_restore(self) -> None:
        if not self._restore_panels() and self.screen.has_class("-output-max"):
            self.action_toggle_output()

    def _show_retraces(self) -> None:
        if self.screen.has_class("-output-max"):
            self.action_toggle_output()
        self._restore_panels()
        self._expand(self.query_one(RetracePanel))

    def action_toggle_output(self) -> None:
        maximised = not self.screen.has_class("-output-max")
        self.screen.set_class(maximised, "-output-max")
        self.refresh_bindings()
        if maximised:
            self.query_one(OutputPanel).log_view.focus()

    def action_fold_native(self) -> None:
        log = self.query_one(OutputPanel).log_view
        log.set_fold(not log.fold_native)
        self.query_one(OutputPanel).border_title = (
            f"{OutputPanel.TITLE} ({log.folded} TensorFlow log lines folded: f)" if log.fold_native
            else OutputPanel.TITLE)

    def action_search_output(self) -> None:
        self.query_one(OutputPanel).open_search()

    def action_toggle_pause(self) -> None:
        assert self._replay is not None
        self._reader.submit(self._replay.toggle_pause)
        self.pull()

    def action_faster(self) -> None:
        assert self._replay is not None
        self._reader.submit(self._replay.faster)
        self.pull()

    def action_slower(self) -> None:
        assert self._replay is not None
        self._reader.submit(self._replay.slower)
        self.pull()

    def action_seek(self, direction: int) -> None:
        assert self._replay is not None
        replay = self._replay
        self._reader.submit(lambda: replay.seek(direction * replay.seek_step_s))
        self.pull()

    def action_seek_start(self) -> None:
        assert self._replay is not None
        self._reader.submit(self._replay.seek_start)
        self.pull()

    def action_seek_end(self) -> None:
        assert self._replay is not None
        self._reader.submit(self._replay.seek_end)
        self.pull()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Textual's commands, then one per key binding that can run now, with the binding's own
        description and tooltip (:func:`palette_bindings`): a key and its command never
        disagree. Textual's own Quit runs :meth:`action_quit`, which asks as q does."""
        yield from super().get_system_commands(screen)
        for b in palette_bindings(self.BINDINGS):
            name, params = _split_action(b.action)
            if not self.check_action(name, params):
                continue
            yield SystemCommand(b.description, b.tooltip, partial(self.run_action, b.action))
        yield SystemCommand("Retraces: every trace", "Each retrace with its step and the whole change",
                            self._show_retraces)


def _untaken_result(cid: str, action: str, message: str, t: float) -> Result:
    return Result(t=t, id=cid, action=action, ok=False, message=message)


def _split_action(action: str) -> tuple[str, tuple[object, ...]]:
    """``"seek(-1)"`` -> ``("seek", (-1,))``, as Textual reads a binding's action."""
    _, name, params = parse(action)
    return name, params


def palette_bindings(bindings: Iterable[Binding | tuple[str, ...]]) -> list[Binding]:
    """The key bindings the command palette lists: each one with an id, but the number keys
    (a panel's number is its name) and q (Textual's palette has its own Quit)."""
    return [b for b in bindings if isinstance(b, Binding) and b.id is not None
            and not b.id.startswith("panel.") and b.id != "quit"]


def run_dashboard(
    run_dir: Path | None,
    source: Source,
    *,
    title: str | None = None,
    keymap: Mapping[str, str] | None = None,
    record_findings: bool = False,
    baseline: Baseline | None = None,
) -> DashboardResult:
    """Shows the dashboard until the user leaves; returns what they chose.

    ``"stop"``: stop training (the caller sends SIGINT, then SIGTERM); ``"detach"``: leave it
    running; ``"quit"``: nothing was running. A hangup (SSH drop) and a dashboard crash count
    as ``"detach"`` on a live run: training is never stopped because the viewer went away.
    """
    app = TpuwatchApp(source, run_dir=run_dir, title=title, keymap=keymap, handle_hangup=True,
                      record_findings=record_findings, baseline=baseline)
    # A closed terminal must not hang Textual's shutdown (see tpuwatch/ui/hangup_driver.py).
    app.driver_class = hangup_safe(app.driver_class)
    try:
        result = app.run()
    finally:
        app.stop_reading()  # no read in progress while the source closes
        source.close()
    if app.hung_up:
        return "detach"
    if result in ("stop", "detach", "quit"):
        return result  # type: ignore[return-value]
    return "detach" if source.live else "quit"


__all__ = ["DashboardResult", "TpuwatchApp", "run_dashboard"]

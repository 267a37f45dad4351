"""The tpuwatch dashboard: one Textual app for live runs, attach and replay.

Data flow (STYLE #5): a timer drains the *source* at a fixed rate (default 4 Hz), applies every
new message to one ``RunState``, then sets ONE immutable ``RunSnapshot`` on the app when the
:class:`~tpuwatch.ui.pacer.Pacer` says it is worth drawing (news at once, numbers once a second);
every panel is bound to that reactive and renders from it. Rendering cost is per frame, not per
message, which is what keeps up with thousands of steps per second.

Entry points for the CLI: :func:`run_dashboard`, :func:`tpuwatch.sources.file_source.make_file_source`,
:func:`tpuwatch.sources.replay_source.make_replay_source`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import signal
import time
from pathlib import Path
from typing import Callable, Iterable, Literal, Mapping

from textual import events, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Grid, Horizontal
from textual.notifications import SeverityLevel
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Input

from tpuwatch import rundir
from tpuwatch.monitor.baseline import Baseline
from tpuwatch.monitor.diagnostics.feed import FindingsFeed
from tpuwatch.monitor.diskspace import full_note
from tpuwatch.monitor.recording import append
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.monitor.state import RunState
from tpuwatch.printable import printable
from tpuwatch.protocol import Command, Result
from tpuwatch.sources.replay_source import ReplaySource
from tpuwatch.sources.source import ReplayControl, Source, apply_worker_health
from tpuwatch.ui.hangup_driver import hangup_safe
from tpuwatch.ui.output_tail import OutputTail
from tpuwatch.ui.pacer import SHOW_PERIOD_S, Pacer
from tpuwatch.ui.replay_output import epoch_anchors, visible_lines
from tpuwatch.ui.screens.help_screen import HelpScreen
from tpuwatch.ui.screens.profile_summary_screen import (
    ProfileSummaryScreen,
    load_summary_text,
    new_profile_results,
)
from tpuwatch.ui.screens.quit_screen import QuitScreen
from tpuwatch.ui.screens.results_screen import ResultsScreen
from tpuwatch.ui.screens.stack_screen import StackScreen
from tpuwatch.ui.screens.text_screen import TextScreen
from tpuwatch.ui.widgets.command_line import CommandLine, command_summary
from tpuwatch.ui.widgets.event_panel import EventPanel
from tpuwatch.ui.widgets.findings_panel import FindingsPanel
from tpuwatch.ui.widgets.goodput_panel import GoodputPanel
from tpuwatch.ui.widgets.input_panel import InputPanel
from tpuwatch.ui.widgets.memory_panel import MemoryPanel
from tpuwatch.ui.widgets.output_panel import OutputPanel
from tpuwatch.ui.widgets.panel import Panel
from tpuwatch.ui.widgets.replay_bar import ReplayBar, ReplayState
from tpuwatch.ui.widgets.replica_loss_panel import ReplicaLossPanel, scale_title
from tpuwatch.ui.widgets.retrace_panel import RetracePanel
from tpuwatch.ui.widgets.run_header import RunHeader, problem_text
from tpuwatch.ui.widgets.step_time_panel import StepTimePanel
from tpuwatch.ui.widgets.workers_panel import WorkersPanel

DashboardResult = Literal["stop", "detach", "quit"]

#: Default refresh rate of the dashboard (Hz).
REFRESH_HZ = 4.0
#: Longest a refresh may spend applying messages before it draws (seconds): catching up on a
#: long recording happens over several frames instead of freezing the screen.
APPLY_BUDGET_S = 0.15
#: A replay holds its whole output.log up to this size to follow the replay position.
REPLAY_OUTPUT_MAX_BYTES = 64 << 20
#: Results this much older than the dashboard's opening are not announced (clock skew margin, s).
TOAST_SLACK_S = 2.0
#: Statuses during which quitting asks whether to stop training.
ACTIVE = ("waiting", "starting", "running", "stalled")
#: Actions that run inside training and take a command id.
COMMAND_ACTIONS = ("profile", "checkpoint")
#: Statuses after which no training process is left to ask or to leave running.
ENDED = ("finished", "stopped", "crashed")
#: Actions that need the training process: hidden once it ended (a key pressed says why).
LIVE_ACTIONS = (*COMMAND_ACTIONS, "stacks", "detach")

#: Panels in the order the number keys (1..9) jump to them.
PANEL_IDS = ("step-time", "loss", "memory", "findings", "input", "retraces", "events", "output-log", "goodput")


class TpuwatchApp(App[str]):
    """The dashboard. ``source`` feeds it (see :mod:`tpuwatch.sources.source`); ``run_dir`` is where
    output.log is tailed from (``None``: no output panel content).

    ``clock`` (unix seconds) stamps live snapshots; ``refresh_hz=0`` turns the timer off, for
    tests that drive :meth:`pull` themselves (then every pull is shown). With the timer on, the
    source is drained ``refresh_hz`` times a second but a snapshot is shown only when
    :class:`~tpuwatch.ui.pacer.Pacer` says so (news at once, numbers once a second).
    """

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
            Binding(str(i + 1), f"focus_panel({i})", f"Panel {i + 1}", id=f"panel.{i + 1}", show=False)
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
        self._baseline = baseline
        #: Append new findings to the recording: only the process that owns the run does.
        self._record_findings = record_findings
        self._handle_hangup = handle_hangup
        #: Set when the terminal hung up (SSH dropped): the caller treats it as a detach.
        self.hung_up = False
        self.source = source
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._disk_checked_at = float("-inf")
        self._disk_note = ""
        if title:
            self.title = title
        self._clock = clock
        self._refresh_hz = refresh_hz
        self._pacer = Pacer(SHOW_PERIOD_S if refresh_hz > 0 else 0.0)
        self._replay_key: tuple = ()
        self._state = RunState(clock=clock)
        self._state.baseline = baseline
        self._findings = FindingsFeed(clock, on_new=self._on_new_findings)
        self._replay: ReplayControl | None = source if isinstance(source, ReplayControl) else None
        self._generation = self._replay.generation if self._replay else 0
        self._tail: OutputTail | None = None
        if self.run_dir is not None:
            # A replay shows the whole log; a live view starts near the end of a long one.
            start = 1 << 62 if self._replay else 1 << 20
            self._tail = OutputTail(self.run_dir / rundir.OUTPUT, start_bytes=start)
        self._sent: dict[str, str] = {}  # action -> id of the command still in flight
        self._sent_ids: set[str] = set()  # every command this dashboard sent
        self._profiles_shown: set[str] = set()
        self._toasted: set[str] | None = None  # ids of ended commands already announced
        self._replay_lines: list[str] | None = None  # a replay's whole output, read once
        self._replay_anchors: list[int] = []
        self._replay_shown = 0
        self._replay_follows_tail = False  # a replay's output.log too long to hold: its end only
        self._opened_t = clock()  # results older than this were in the recording already
        self._binding_key: tuple = ()
        self._source_error = ""
        self._keymap = dict(keymap or {})

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
            yield OutputPanel(id="output")
            yield EventPanel(id="events").data_bind(TpuwatchApp.snapshot)
            yield GoodputPanel(id="goodput").data_bind(TpuwatchApp.snapshot)
        # The palette key is listed in the help screen: the footer's room goes to our keys.
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        if self._keymap:
            self.set_keymap(self._keymap)
        self.pull()
        if self._refresh_hz > 0:
            self.set_interval(1.0 / self._refresh_hz, self.pull, name="refresh")
        if self._handle_hangup and hasattr(signal, "SIGHUP"):
            # Without this a dropped SSH session kills the viewer mid-frame; training lives in
            # its own session either way, but the caller should learn it was a detach.
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._hangup)

    def on_unmount(self) -> None:
        if self._handle_hangup and hasattr(signal, "SIGHUP"):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)

    def _hangup(self) -> None:
        self.hung_up = True
        self.exit("detach")

    # --- data ------------------------------------------------------------------------------

    def _disk_full_note(self) -> str:
        """Live runs: whether the run directory's disk is full (one statvfs every 2 s)."""
        if self.run_dir is None or not self.source.live:
            return ""
        t = time.monotonic()
        if t >= self._disk_checked_at + 2.0:
            self._disk_checked_at = t
            self._disk_note = full_note(self.run_dir)
        return self._disk_note

    def pull(self) -> None:
        """Drains the source into the run state and publishes one new snapshot."""
        replay = self._replay
        if replay is not None and replay.generation != self._generation:
            self._generation = replay.generation
            self._pacer.reset()
            self._state = RunState(clock=self._clock)
            self._state.baseline = self._baseline
            self._findings = FindingsFeed(self._clock, on_new=self._on_new_findings)
        apply = self._state.apply
        diagnose = self._findings.apply
        # Several workers' streams (a group, several HOST:PORT): each message with its worker.
        poll = self.source.poll_tagged
        deadline = time.perf_counter() + APPLY_BUDGET_S
        backlog = False  # the budget ran out with messages still coming: more are waiting
        try:
            while True:
                batch = poll()
                for worker, msg in batch:
                    apply(msg, worker)
                    diagnose(msg, worker)
                if not batch:
                    break
                if time.perf_counter() > deadline:
                    backlog = True
                    break
            apply_worker_health(self.source, self._state)
            stats = self.source.read_stats()
            if stats is not None:  # unreadable lines: the header says so when nothing else came
                self._state.note_read_stats(malformed=stats.malformed, unknown=stats.unknown,
                                            truncated_tail=stats.truncated_tail)
        except OSError as e:
            self._report_source_error(f"reading the run failed: {e}")
        now = self.source.now()
        now = self._clock() if now is None else now
        self._findings.evaluate(self._state, now)
        disk = self._disk_full_note()
        # The state counts its news: a snapshot is built only when one is shown.
        shown = self._pacer.due((self._state.version, disk, backlog), time.monotonic())
        if shown:
            snap = self._state.snapshot(now=now)
            self.snapshot = dataclasses.replace(snap, disk_full=disk, catching_up=backlog) \
                if disk or backlog else snap
        self._command_line.tick(now)
        for done in new_profile_results(self.snapshot, self._profiles_shown, ids=self._sent_ids):
            self._show_profile(done, self.snapshot.input_recent)
        self._toast_results()
        if isinstance(self.screen, TextScreen):
            self.screen.show(self.snapshot)
        if self._tail is not None and replay is not None and not self._replay_follows_tail:
            self._replay_output(replay)
        elif self._tail is not None:
            try:
                lines = self._tail.read_lines()
            except OSError as e:
                self._report_source_error(f"reading output.log failed: {e}")
            else:
                if lines:
                    self.query_one(OutputPanel).append(lines)
        replay_key = (replay.paused, replay.speed, replay.at_end) if replay is not None else ()
        if replay is not None and (shown or replay_key != self._replay_key):
            self._replay_key = replay_key
            self.query_one(ReplayBar).state = ReplayState(
                paused=replay.paused,
                speed=replay.speed,
                position_s=replay.position - replay.start_t,
                duration_s=replay.end_t - replay.start_t,
                at_end=replay.at_end,
            )
        self._refresh_bindings_if_changed()

    def _replay_output(self, replay: ReplayControl) -> None:
        """Keeps the Output panel in step with the replay position (see replay_output.py)."""
        if self._replay_lines is None:
            assert self._tail is not None
            lines: list[str] = []
            try:
                if self._tail.path.stat().st_size > REPLAY_OUTPUT_MAX_BYTES:
                    # Too long to hold: its end, as before, and the panel says so.
                    title = f"{OutputPanel.TITLE} (its end: too long to follow the replay)"
                    self.query_one(OutputPanel).border_title = title
                    self._tail = OutputTail(self._tail.path, start_bytes=1 << 20)
                    self._replay_follows_tail = True
                    return
                while chunk := self._tail.read_lines():  # bounded: the size checked above
                    lines.extend(chunk)
                lines.extend(self._tail.flush())
            except FileNotFoundError:
                pass
            except OSError as e:
                self._report_source_error(f"reading output.log failed: {e}")
            self._replay_lines = lines
            self._replay_anchors = epoch_anchors(lines)
            if lines and not self._replay_anchors:
                self.query_one(OutputPanel).border_title = f"{OutputPanel.TITLE} (replay position approximate)"
        s = self.snapshot
        span = replay.end_t - replay.start_t
        fraction = (replay.position - replay.start_t) / span if span > 0 else 1.0
        ended = replay.at_end or s.status in ("finished", "stopped", "crashed", "lost")
        begun = 0 if s.epoch is None else s.epoch + 1
        ended_epochs = s.epoch_logs[-1][0] + 1 if s.epoch_logs else 0
        n = visible_lines(len(self._replay_lines), self._replay_anchors, begun, ended_epochs, fraction, ended)
        panel = self.query_one(OutputPanel)
        if n < self._replay_shown:  # seeking back: start over
            panel.log_view.clear()
            self._replay_shown = 0
        if n > self._replay_shown:
            panel.append(self._replay_lines[self._replay_shown:n])
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
            text = command_summary(c, self.run_dir).plain
            if c.status == "failed":
                self.notify(text, severity="error", timeout=12)
            else:
                self.notify(text + "  (r: all results)", timeout=8)

    def _on_new_findings(self, findings: list) -> None:
        if self._record_findings and self.run_dir is not None and self._replay is None:
            try:
                append(self.run_dir / rundir.EVENTS, findings)
            except OSError as e:
                self._report_source_error(f"cannot record findings: {e}")

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
        if action in ("expand", "loss_scale", "fold_native") and len(self.screen_stack) > 1:
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

        dumps = lambda: self._state.stack_dumps  # noqa: E731
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
        self._state.apply(command)  # shows as "pending" until the agent answers
        self.pull()
        self._deliver(command)

    @work(thread=True, group="profile-summary", exit_on_error=False)
    def _show_profile(self, command, live) -> None:
        # xprof takes up to ~0.3 s: never on the UI thread.
        text = load_summary_text(command, live)
        self.call_from_thread(self.push_screen, ProfileSummaryScreen(text))

    @work(thread=True, group="commands", exit_on_error=False)
    def _deliver(self, command: Command) -> None:
        # Connecting to the agent may take up to its connect timeout: never on the UI thread.
        try:
            self.source.send(command)
        except OSError as e:
            self.call_from_thread(self._send_failed, command, str(e) or type(e).__name__)

    def _send_failed(self, command: Command, reason: str) -> None:
        self._sent.pop(command.action, None)
        now = self.source.now()
        self._state.apply(Result(t=self._clock() if now is None else now, id=command.id,
                                 action=command.action, ok=False, message=f"not sent: {reason}"))
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
        rows.append(("1 … 9", "Jump to a panel (step, loss, memory, findings, …, goodput)", True))
        rows.append(("tab, shift+tab", "Next / previous panel", True))
        rows.append(("n, N", "Next / previous search match (output)", True))
        rows.append(("[ ] v (Workers)", "Select a worker; v: its every record instead of summaries (many hosts)",
                     True))
        # Glyphs, so none is unexplained (the expanded Step time panel says the same).
        rows.append(("▲ (chart)", "Step time: the first step (tracing, compiling), above the scale", True))
        rows.append(("w (chart)", "Step time: input wait, share of each step (full height 100%)", True))
        return rows

    def action_focus_panel(self, index: int) -> None:
        widget = self.query_one(f"#{PANEL_IDS[index]}")
        self._restore_panels()
        if self.screen.has_class("-output-max") and PANEL_IDS[index] != "output-log":
            self.action_toggle_output()
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
        return bool(expanded)

    def _zoomed(self) -> bool:
        """A panel expanded or the output maximised: esc (and q) put it back."""
        return len(self.screen_stack) == 1 and (
            self.screen.has_class("-panel-max") or self.screen.has_class("-output-max"))

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
        self._replay.toggle_pause()
        self.pull()

    def action_faster(self) -> None:
        assert self._replay is not None
        self._replay.faster()
        self.pull()

    def action_slower(self) -> None:
        assert self._replay is not None
        self._replay.slower()
        self.pull()

    def action_seek(self, direction: int) -> None:
        assert self._replay is not None
        self._replay.seek(direction * self._replay.seek_step_s)
        self.pull()

    def action_seek_start(self) -> None:
        assert self._replay is not None
        self._replay.seek_start()
        self.pull()

    def action_seek_end(self) -> None:
        assert self._replay is not None
        self._replay.seek_end()
        self.pull()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if self.check_action("profile", ()):
            yield SystemCommand("Profile", "Capture a profile of the next steps", self.action_profile)
        if self.check_action("checkpoint", ()):
            yield SystemCommand("Checkpoint", "Save a checkpoint at the next step boundary", self.action_checkpoint)
        if self.check_action("stacks", ()):
            yield SystemCommand("Stacks", "Every thread's stack of the training process", self.action_stacks)
        yield SystemCommand("Results", "Every command's result with full paths", self.action_results)
        yield SystemCommand("Loss chart: next scale", "Recent window, log scale, whole run", self.action_loss_scale)
        yield SystemCommand("Panel: expand / restore", "The focused panel on the whole screen", self.action_expand)
        yield SystemCommand("Retraces: every trace", "Each retrace with its step and the whole change",
                            self._show_retraces)
        yield SystemCommand("Help", "Every key", self.action_help)
        yield SystemCommand("Output: maximise / restore", "Show the script's output full screen", self.action_toggle_output)
        yield SystemCommand("Output: search", "Search the script's output", self.action_search_output)
        yield SystemCommand("Output: fold TensorFlow logs", "Hide / show TF's C++ log lines",
                            self.action_fold_native)
        if self.check_action("detach", ()):
            yield SystemCommand("Detach", "Leave the dashboard; training keeps running", self.action_detach)
        if self._replay is not None:
            yield SystemCommand("Replay: pause / play", "Toggle playback", self.action_toggle_pause)
            yield SystemCommand("Replay: faster", "Double the playback speed", self.action_faster)
            yield SystemCommand("Replay: slower", "Halve the playback speed", self.action_slower)
            yield SystemCommand("Replay: jump to end", "Show the run as it ended", self.action_seek_end)


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
        source.close()
    if app.hung_up:
        return "detach"
    if result in ("stop", "detach", "quit"):
        return result  # type: ignore[return-value]
    return "detach" if source.live else "quit"


__all__ = ["DashboardResult", "ReplaySource", "TpuwatchApp", "run_dashboard"]

"""The tpuwatch dashboard: one Textual app for live runs, attach and replay.

Data flow (STYLE #5): a timer drains the *source* at a fixed rate (default 4 Hz), applies every
new message to one ``RunState``, then sets ONE immutable ``RunSnapshot`` on the app; every panel
is bound to that reactive and renders from it. Rendering cost is per refresh, not per message,
which is what keeps up with thousands of steps per second.

Entry points for the CLI: :func:`run_dashboard`, :func:`tpuwatch.ui.file_source.make_file_source`,
:func:`tpuwatch.ui.replay_source.make_replay_source`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import signal
import time
from pathlib import Path
from typing import Callable, Iterable, Literal, Mapping, Protocol

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Grid, Horizontal
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Input

from tpuwatch import rundir
from tpuwatch.monitor.diagnostics.feed import FindingsFeed
from tpuwatch.monitor.diskspace import full_note
from tpuwatch.monitor.recording import append
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.protocol import Command, Message, Result
from tpuwatch.ui.group_source import apply_worker_health
from tpuwatch.ui.hangup_driver import hangup_safe
from tpuwatch.ui.output_tail import OutputTail
from tpuwatch.ui.replay_source import ReplaySource
from tpuwatch.ui.screens.help_screen import HelpScreen
from tpuwatch.ui.screens.profile_summary_screen import ProfileSummaryScreen, load_summary_text, new_profile_results
from tpuwatch.ui.screens.quit_screen import QuitScreen
from tpuwatch.ui.screens.stack_screen import StackScreen
from tpuwatch.ui.source import ReplayControl, Source
from tpuwatch.ui.widgets.command_line import CommandLine
from tpuwatch.ui.widgets.event_panel import EventPanel
from tpuwatch.ui.widgets.findings_panel import FindingsPanel
from tpuwatch.ui.widgets.input_panel import InputPanel
from tpuwatch.ui.widgets.memory_panel import MemoryPanel
from tpuwatch.ui.widgets.output_panel import OutputPanel
from tpuwatch.ui.widgets.replay_bar import ReplayBar, ReplayState
from tpuwatch.ui.widgets.replica_loss_panel import ReplicaLossPanel
from tpuwatch.ui.widgets.retrace_panel import RetracePanel
from tpuwatch.ui.widgets.run_header import RunHeader
from tpuwatch.ui.widgets.step_time_panel import StepTimePanel
from tpuwatch.ui.widgets.workers_panel import WorkersPanel

DashboardResult = Literal["stop", "detach", "quit"]

#: Default refresh rate of the dashboard (Hz).
REFRESH_HZ = 4.0
#: Longest a refresh may spend applying messages before it draws (seconds): catching up on a
#: long recording happens over several frames instead of freezing the screen.
APPLY_BUDGET_S = 0.15
#: Statuses during which quitting asks whether to stop training.
ACTIVE = ("waiting", "starting", "running", "stalled")
#: Actions that run inside training and take a command id.
COMMAND_ACTIONS = ("profile", "checkpoint")

#: Panels in the order the number keys (1..8) jump to them.
PANEL_IDS = ("step-time", "loss", "memory", "findings", "input", "retraces", "events", "output-log")


class StateLike(Protocol):
    """What the app needs from ``tpuwatch.monitor.state.RunState``."""

    def apply(self, msg: Message, worker: str | None = None) -> None: ...

    def snapshot(self, now: float | None = None) -> RunSnapshot: ...


def _default_state(clock: Callable[[], float]) -> StateLike:
    from tpuwatch.monitor.state import RunState

    return RunState(clock=clock)


class TpuwatchApp(App[str]):
    """The dashboard. ``source`` feeds it (see :mod:`tpuwatch.ui.source`); ``run_dir`` is where
    output.log is tailed from (``None``: no output panel content).

    ``clock`` (unix seconds) stamps live snapshots; ``refresh_hz=0`` turns the timer off, for
    tests that drive :meth:`pull` themselves.
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
        Binding("slash", "search_output", "Search", id="search", tooltip="Search the output log", show=False),
        Binding("d", "detach", "Detach", id="detach", tooltip="Leave; training keeps running"),
        Binding("s", "stacks", "Stacks", id="stacks", show=False,
                tooltip="Show every thread's stack of the training process (a stalled or hung run)"),
        Binding("question_mark", "help", "Help", id="help", tooltip="This help"),
        Binding("q", "request_quit", "Quit", id="quit", tooltip="Quit (asks first while training runs)"),
        Binding("space", "toggle_pause", "Pause", id="replay.pause", show=False, priority=True,
                tooltip="Replay: pause / play"),
        Binding("plus,equals_sign", "faster", "Faster", id="replay.faster", show=False, priority=True,
                tooltip="Replay: faster"),
        Binding("minus", "slower", "Slower", id="replay.slower", show=False, priority=True,
                tooltip="Replay: slower"),
        Binding("left", "seek(-1)", "Back", id="replay.back", show=False, priority=True,
                tooltip="Replay: back 2% of the recording"),
        Binding("right", "seek(1)", "Forward", id="replay.forward", show=False, priority=True,
                tooltip="Replay: forward 2% of the recording"),
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
        state_factory: Callable[[Callable[[], float]], StateLike] = _default_state,
        keymap: Mapping[str, str] | None = None,
        handle_hangup: bool = False,
        record_findings: bool = False,
    ) -> None:
        super().__init__()
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
        self._state_factory = state_factory
        self._state = state_factory(clock)
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
        self._binding_key: tuple = ()
        self._source_error = ""
        self._keymap = dict(keymap or {})

    # --- layout ----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield RunHeader(id="header").data_bind(TpuwatchApp.snapshot)
        yield CommandLine(id="commands").data_bind(TpuwatchApp.snapshot)
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
            self._state = self._state_factory(self._clock)
            self._findings = FindingsFeed(self._clock, on_new=self._on_new_findings)
        apply = self._state.apply
        diagnose = self._findings.apply
        # Several workers' streams (a group, several HOST:PORT): each message with its worker.
        tagged = getattr(self.source, "poll_tagged", None)
        deadline = time.perf_counter() + APPLY_BUDGET_S
        try:
            while True:
                if tagged is not None:
                    batch = tagged()
                    for worker, msg in batch:
                        apply(msg, worker)
                        diagnose(msg, worker)
                else:
                    batch = self.source.poll()
                    for msg in batch:
                        apply(msg)
                        diagnose(msg)
                if not batch or time.perf_counter() > deadline:
                    break
            apply_worker_health(self.source, self._state)
        except OSError as e:
            self._report_source_error(f"reading the run failed: {e}")
        now = self.source.now()
        now = self._clock() if now is None else now
        self._findings.evaluate(self._state, now)
        snap = self._state.snapshot(now=now)
        disk = self._disk_full_note()
        self.snapshot = dataclasses.replace(snap, disk_full=disk) if disk else snap
        for done in new_profile_results(self.snapshot, self._profiles_shown, ids=self._sent_ids):
            self._show_profile(done)
        if self._tail is not None:
            try:
                lines = self._tail.read_lines()
            except OSError as e:
                self._report_source_error(f"reading output.log failed: {e}")
            else:
                if lines:
                    self.query_one(OutputPanel).append(lines)
        if replay is not None:
            self.query_one(ReplayBar).state = ReplayState(
                paused=replay.paused,
                speed=replay.speed,
                position_s=replay.position - replay.start_t,
                duration_s=replay.end_t - replay.start_t,
                at_end=replay.at_end,
            )
        self._refresh_bindings_if_changed()

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
        return self.source.live and self.snapshot.status in ACTIVE

    def _refresh_bindings_if_changed(self) -> None:
        key = (self._run_active(), *(self._busy(a) for a in COMMAND_ACTIONS))
        if key != self._binding_key:
            self._binding_key = key
            self.refresh_bindings()

    # --- actions ---------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
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

    def action_profile(self) -> None:
        self._send("profile")

    def action_checkpoint(self) -> None:
        self._send("checkpoint")

    def action_stacks(self) -> None:
        if isinstance(self.screen, StackScreen):
            return
        from tpuwatch.monitor.stack_request import StackRequest

        dumps = lambda: tuple(getattr(self._state, "stack_dumps", ()))  # noqa: E731
        before = dumps()
        self._send("stack_dump")
        snap = self.snapshot
        request = StackRequest(self._sent["stack_dump"], run_dir=self.run_dir, pid=snap.pid, host=snap.host)
        request.remember_existing(before)
        self.push_screen(StackScreen(request, lambda: (self.snapshot.commands, dumps())))

    def _send(self, action: str) -> None:
        command = Command(id=f"{action}-{secrets.token_hex(4)}", action=action)
        self._sent[action] = command.id
        self._sent_ids.add(command.id)
        self._state.apply(command)  # shows as "pending" until the agent answers
        self.pull()
        self._deliver(command)

    @work(thread=True, group="profile-summary", exit_on_error=False)
    def _show_profile(self, command) -> None:
        # xprof takes up to ~0.3 s: never on the UI thread.
        text = load_summary_text(command)
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

    def key_rows(self) -> list[tuple[str, str, bool]]:
        """(keys as currently mapped, description, enabled now) for the help screen."""
        rows: list[tuple[str, str, bool]] = []
        seen: set[str] = set()
        for key, bindings in self._bindings.key_to_bindings.items():
            for b in bindings:
                if b.id is None or b.id.startswith("panel.") or b.id in seen:
                    continue
                seen.add(b.id)
                action = b.action.split("(")[0]
                enabled = self.check_action(action, ())
                if enabled is False and action not in COMMAND_ACTIONS and action != "detach":
                    continue
                keys = ", ".join(
                    self.get_key_display(x)
                    for k, bs in self._bindings.key_to_bindings.items()
                    for x in bs
                    if x.id == b.id
                )
                rows.append((keys, b.tooltip or b.description, bool(enabled)))
        rows.append(("1 … 8", "Jump to a panel (step, loss, memory, findings, …)", True))
        rows.append(("tab, shift+tab", "Next / previous panel", True))
        rows.append(("n, N", "Next / previous search match (output)", True))
        return rows

    def action_focus_panel(self, index: int) -> None:
        widget = self.query_one(f"#{PANEL_IDS[index]}")
        if not widget.display or not widget.parent or not getattr(widget.parent, "display", True):
            self.notify("That panel is hidden at this size (widen the terminal, or press o for output).", timeout=4)
            return
        if self.screen.has_class("-output-max") and PANEL_IDS[index] != "output-log":
            self.action_toggle_output()
        widget.focus()

    def action_toggle_output(self) -> None:
        maximised = not self.screen.has_class("-output-max")
        self.screen.set_class(maximised, "-output-max")
        if maximised:
            self.query_one(OutputPanel).log_view.focus()

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
        step = getattr(self._replay, "seek_step_s", 5.0)
        self._replay.seek(direction * step)
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
        yield SystemCommand("Output: maximise / restore", "Show the script's output full screen", self.action_toggle_output)
        yield SystemCommand("Output: search", "Search the script's output", self.action_search_output)
        if self.source.live:
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
) -> DashboardResult:
    """Shows the dashboard until the user leaves; returns what they chose.

    ``"stop"``: stop training (the caller sends SIGINT, then SIGTERM); ``"detach"``: leave it
    running; ``"quit"``: nothing was running. A hangup (SSH drop) and a dashboard crash count
    as ``"detach"`` on a live run: training is never stopped because the viewer went away.
    """
    app = TpuwatchApp(source, run_dir=run_dir, title=title, keymap=keymap, handle_hangup=True,
                      record_findings=record_findings)
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

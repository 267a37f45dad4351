"""The dashboard driven by recorded runs through Textual's Pilot: numbers shown, keys, dialogs."""

from __future__ import annotations

import math

import pytest
from textual.widgets import Button, Input, Static
from ui_support import FakeClock, ended_replay, last_t, recording, screen_text, sync

from tpuwatch import units
from tpuwatch.monitor.state import RunState
from tpuwatch.protocol import CommandState, Result
from tpuwatch.sources.replay_source import ReplaySource
from tpuwatch.ui.app import TpuwatchApp
from tpuwatch.ui.screens.help_screen import HelpScreen
from tpuwatch.ui.screens.quit_screen import QuitScreen
from tpuwatch.ui.widgets.output_log import OutputLog


def body(app: TpuwatchApp, panel_id: str) -> str:
    return str(app.query_one(f"#{panel_id} > .body", Static).render())


def final_state(name: str) -> RunState:
    state = RunState()
    for msg in recording(name):
        state.apply(msg)
    return state


@sync
async def test_healthy_run_shows_its_numbers() -> None:
    messages = recording("healthy_4replica")
    expected = final_state("healthy_4replica").snapshot(now=last_t(messages))
    app = TpuwatchApp(ended_replay("healthy_4replica"), refresh_hz=0)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        text = screen_text(app)
        assert "FINISHED" in text
        assert "step 300/300 (100%)" in text
        assert "train.py · MirroredStrategy · 4× CPU · tpu-vm-0" in text
        step = body(app, "step-time")
        assert units.duration(expected.step_p50_s).replace(" ", "") in step
        assert units.duration(expected.step_p95_s).replace(" ", "") in step
        loss = body(app, "loss")
        assert len(expected.replica_losses) == 4
        for r in expected.replica_losses:
            assert f"r{r.index}" in loss and units.loss(r.loss) in loss
        assert "No findings" in body(app, "findings")
        assert "train_step" in body(app, "retraces")
        assert "checkpoint done" in text  # the recorded checkpoint command's result


@sync
async def test_input_bound_run_is_flagged_high() -> None:
    app = TpuwatchApp(ended_replay("input_bound"), refresh_hz=0)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        frac = app.snapshot.input_wait_frac
        assert frac is not None and frac >= 0.2
        text = body(app, "input")
        assert units.percent(frac) in text and "highly input-bound" in text
        assert app.query_one("#input").has_class("-critical")
        assert not app.query_one("#loss").has_class("-critical")


@sync
async def test_crashed_run_marks_nan_replica_and_exit_code() -> None:
    app = TpuwatchApp(ended_replay("crashed"), refresh_hz=0)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        text = screen_text(app)
        assert "CRASHED exit 1" in text
        assert "NON-FINITE" in body(app, "loss")
        assert app.query_one("#loss").has_class("-critical")
        assert "FloatingPointError" in body(app, "findings")
        assert app.query_one("#findings").has_class("-critical")


@sync
async def test_narrow_layout_keeps_the_essentials() -> None:
    app = TpuwatchApp(ended_replay("healthy_4replica"), refresh_hz=0)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.screen.has_class("-narrow")
        # content rows (inside the border), even with the replay bar and the command line
        # taking a row each
        for shown, rows in (("#step-time", 6), ("#loss", 6), ("#memory", 4), ("#findings", 4), ("#output", 3)):
            assert app.query_one(shown).display and app.query_one(shown).size.height >= rows, shown
        for hidden in ("#input", "#retraces", "#events"):
            assert not app.query_one(hidden).display, hidden
        text = screen_text(app).splitlines()
        assert len(text) == 24 and all(len(line) <= 80 for line in text)


@sync
async def test_help_lists_keys_and_closes() -> None:
    app = TpuwatchApp(ended_replay("healthy_4replica"), refresh_hz=0)
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = screen_text(app)
        for key_help in ("Profile the next steps", "Save a checkpoint", "Search the output log", "Quit (asks first"):
            assert key_help in text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


@sync
async def test_remapped_key_works_and_shows_in_help() -> None:
    app = TpuwatchApp(ended_replay("healthy_4replica"), refresh_hz=0, keymap={"help": "f1"})
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("f1")
        await pilot.pause()  # the help screen is pushed after the key is handled
        assert isinstance(app.screen, HelpScreen)
        assert "f1" in screen_text(app)


@pytest.mark.parametrize(("key", "expected"), [("s", "stop"), ("d", "detach")])
@sync
async def test_quit_on_live_run_asks_and_returns_choice(live_app, key: str, expected: str) -> None:
    app = live_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.snapshot.status == "running"
        await pilot.press("q")
        assert isinstance(app.screen, QuitScreen)
        text = screen_text(app)
        assert "Stop training" in text and "Detach" in text and "Cancel" in text
        await pilot.press(key)
    assert app.return_value == expected


@sync
async def test_quit_dialog_cancel_keeps_running_and_buttons_work(live_app) -> None:
    app = live_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("q")
        assert isinstance(app.screen, QuitScreen)
        assert app.focused is app.screen.query_one("#cancel", Button)  # enter never stops training
        await pilot.press("enter")
        assert not isinstance(app.screen, QuitScreen) and app.is_running
        await pilot.press("q")
        await pilot.click("#stop")
    assert app.return_value == "stop"


@sync
async def test_q_on_finished_run_just_quits() -> None:
    app = TpuwatchApp(ended_replay("healthy_4replica"), refresh_hz=0)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("q")
    assert app.return_value == "quit"


@sync
async def test_detach_key_on_live_run(live_app) -> None:
    app = live_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("d")
    assert app.return_value == "detach"


@sync
async def test_profile_and_checkpoint_hidden_in_a_replay() -> None:
    app = TpuwatchApp(ended_replay("healthy_4replica"), refresh_hz=0)
    async with app.run_test(size=(80, 24)) as pilot:
        # A recording cannot act: the keys are hidden (not dimmed), and gone from the palette.
        assert app.check_action("profile", ()) is False
        assert app.check_action("checkpoint", ()) is False
        assert app.check_action("stacks", ()) is False
        assert "Profile" not in screen_text(app) and "Checkpoint" not in screen_text(app)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Profile" not in titles and "Stacks" not in titles
        assert app.check_action("detach", ()) is False
        await pilot.press("p", "c")
        assert not app.snapshot.commands or all(c.id.startswith("c") for c in app.snapshot.commands)


@sync
async def test_profile_disabled_without_sender(live_app, sent) -> None:
    app = live_app(can_send=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("p")
        assert app.check_action("profile", ()) is None
    assert sent == []


@sync
async def test_profile_sends_command_and_shows_progress(live_app, sent) -> None:
    app = live_app(upto=150)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.check_action("profile", ()) is True
        await pilot.press("p")
        await app.workers.wait_for_complete()
        assert [c.action for c in sent] == ["profile"]
        cid = sent[0].id
        assert "profile sent" in screen_text(app)
        assert app.check_action("profile", ()) is None  # busy: no second profile
        assert app.check_action("checkpoint", ()) is True  # the other action stays available
        await pilot.press("p")
        await app.workers.wait_for_complete()
        assert len(sent) == 1
        # The agent answers through the recording, as it would live.
        t = app.snapshot.now
        app._state.apply(CommandState(t=t, id=cid, action="profile", state="running", step=160))
        app.pull()
        await pilot.pause()
        assert "profile running" in screen_text(app)
        app._state.apply(Result(t=t, id=cid, action="profile", ok=True, message="profile saved",
                                details={"path": "/r/profiles/1", "bytes": 3 << 20, "seconds": 2.5}))
        app.pull()
        await pilot.pause()
        text = screen_text(app)
        assert "profile done: /r/profiles/1 · 3.00 MiB · 2.50 s" in text
        assert app.check_action("profile", ()) is True


@sync
async def test_failed_send_is_reported_not_raised(live_app) -> None:
    app = live_app()

    def broken(command) -> None:
        raise OSError("agent socket closed")

    app.source._send = broken
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("c")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert any("agent socket closed" in n.message for n in app._notifications)
        assert "checkpoint failed: not sent: agent socket closed" in screen_text(app)
        assert app.check_action("checkpoint", ()) is True


@sync
async def test_live_tail_follows_new_messages_and_output(live_app, tmp_path) -> None:
    app = live_app(upto=100, output="epoch 1\n")
    run = app.run_dir
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        before = app.snapshot.step
        from ui_support import DATA

        more = (DATA / "healthy_4replica.jsonl").read_bytes().splitlines(keepends=True)[100:160]
        with open(run / "events.jsonl", "ab") as f:
            f.write(b"".join(more))
        with open(run / "output.log", "a") as f:
            f.write("\x1b[32mloss: 0.5\x1b[0m\nprogress 1/3\rprogress 3/3\n")
        app._clock.t += 5
        app.pull()
        await pilot.pause()
        assert app.snapshot.step > before
        assert f"step {units.integer(app.snapshot.step)}/300" in screen_text(app)
        log = app.query_one(OutputLog)
        assert list(log.lines[-3:]) == ["epoch 1", "loss: 0.5", "progress 3/3"]


@sync
async def test_output_search_and_maximise(live_app) -> None:
    output = "".join(f"line {i}\n" for i in range(200)) + "needle here\n" + "".join(f"tail {i}\n" for i in range(50))
    app = live_app(output=output)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("o")
        assert app.screen.has_class("-output-max")
        assert not app.query_one("#panels").display
        await pilot.press("slash")
        assert isinstance(app.focused, Input)
        await pilot.press(*"needle", "enter")
        await pilot.pause()
        log = app.query_one(OutputLog)
        assert log.matches == [200]
        assert "needle here" in screen_text(app)
        assert "1/1" in str(app.query_one("#output").border_subtitle)
        await pilot.press("o")
        assert app.query_one("#panels").display


@sync
async def test_number_keys_focus_panels() -> None:
    app = TpuwatchApp(ended_replay("healthy_4replica"), refresh_hz=0)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("2")
        assert app.focused is app.query_one("#loss")
        await pilot.press("6")
        assert app.focused is app.query_one("#retraces")
        await pilot.press("tab")
        assert app.focused is not app.query_one("#retraces")


def _palette(app: TpuwatchApp) -> dict[str, list[str]]:
    """{help text: [titles]} of the palette's commands as the open palette lists them."""
    out: dict[str, list[str]] = {}
    for c in app.get_system_commands(app.screen):
        out.setdefault(c.help, []).append(c.title)
    return out


@sync
async def test_palette_offers_the_same_actions(live_app) -> None:
    """The palette is generated from the key bindings: each binding that can run now is one
    command, titled with the binding's description and explained by its tooltip (18 commands had repeated the keys' texts in
    other words)."""
    from textual.command import CommandPalette

    from tpuwatch.ui.app import palette_bindings

    live = live_app()
    async with live.run_test(size=(100, 30)) as pilot:
        await pilot.press("ctrl+p")  # listed with the palette open, as the user sees them
        await pilot.pause()
        assert isinstance(live.screen, CommandPalette)
        palette = _palette(live)
        offered = [b for b in palette_bindings(TpuwatchApp.BINDINGS) if not b.id.startswith("replay.")
                   and b.id != "restore"]  # a replay's keys; esc only while a panel is expanded
        assert {"Profile", "Checkpoint", "Detach", "Stacks", "Results", "Help", "Search"} <= {b.description for b in offered}
        for b in offered:
            assert palette.get(b.tooltip) == [b.description], (b.id, palette.get(b.tooltip))
        assert sum(titles.count("Quit") for titles in palette.values()) == 1  # Textual's, which asks
        await pilot.press("escape")
        # A command runs the binding's action: the same as its key.
        command = next(c for c in live.get_system_commands(live.screen) if c.title == "Output")
        live.call_later(command.callback)  # as the palette runs it
        await pilot.pause()
        assert live.screen.has_class("-output-max")

    replay = TpuwatchApp(ended_replay("healthy_4replica"), refresh_hz=0)
    async with replay.run_test(size=(100, 30)):
        palette = _palette(replay)
        for b in palette_bindings(TpuwatchApp.BINDINGS):
            if b.id.startswith("replay."):
                assert palette.get(b.tooltip) == [b.description], (b.id, palette.get(b.tooltip))


@sync
async def test_replay_pause_speed_and_seek() -> None:
    messages = recording("healthy_4replica")
    clock = FakeClock(100.0)
    source = ReplaySource(messages, speed=1.0, clock=clock)
    app = TpuwatchApp(source, refresh_hz=0)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.snapshot.step == 0
        clock.t += 5.0
        app.pull()
        mid = app.snapshot.step
        assert 0 < mid < 300
        await pilot.press("space")  # pause
        assert source.paused
        clock.t += 100.0
        app.pull()
        assert app.snapshot.step == mid  # paused: nothing moves
        await pilot.press("plus", "plus")
        assert source.speed == 4.0
        await pilot.press("minus")
        assert source.speed == 2.0
        await pilot.press("end")
        assert app.snapshot.status == "finished" and app.snapshot.step == 300
        await pilot.press("home")
        assert app.snapshot.step == 0 and source.generation >= 1  # state rebuilt from the start
        await pilot.press("right", "right", "right")
        after_seek = app.snapshot.step
        assert after_seek > 0
        await pilot.press("left")
        assert app.snapshot.step < after_seek
        assert "REPLAY" in screen_text(app) and "paused 2×" in screen_text(app)


@sync
async def test_replay_keys_do_not_steal_typing_in_search() -> None:
    app = TpuwatchApp(ended_replay("healthy_4replica"), refresh_hz=0)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("slash", "a", "space", "b", "left", "c")
        assert app.query_one("#output-search", Input).value == "a cb"


@sync
async def test_timer_refreshes_without_manual_pull(tmp_path) -> None:
    from ui_support import make_live_run

    from tpuwatch.sources.file_source import FileSource

    run = make_live_run(tmp_path, "healthy_4replica", upto=50)
    app = TpuwatchApp(FileSource(run), run_dir=run, clock=FakeClock(1_750_000_003.0), refresh_hz=20)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        first = app.snapshot.messages
        from ui_support import DATA

        more = (DATA / "healthy_4replica.jsonl").read_bytes().splitlines(keepends=True)[50:80]
        with open(run / "events.jsonl", "ab") as f:
            f.write(b"".join(more))
        # Numbers are shown at most once a second (tpuwatch/ui/pacer.py): poll, bounded.
        for _ in range(50):
            await pilot.pause(0.1)
            if app.snapshot.messages != first:
                break
        assert app.snapshot.messages == first + 30
        assert not math.isnan(app.snapshot.now)


@sync
async def test_stalled_run_is_marked_stale(live_app) -> None:
    app = live_app()
    app._clock.t += 600  # ten minutes without a step
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.snapshot.status == "stalled"
        assert app.query_one("#header").has_class("-stale")
        assert app.query_one("#step-time").has_class("-stale")
        assert "STALLED 10:0" in screen_text(app)


@sync
async def test_hangup_detaches(live_app) -> None:
    import os
    import signal

    app = live_app()
    app._handle_hangup = True
    async with app.run_test(size=(80, 24)) as pilot:
        os.kill(os.getpid(), signal.SIGHUP)  # what a dropped SSH session sends
        await pilot.pause(0.1)
    assert app.hung_up and app.return_value == "detach"


@sync
async def test_the_replay_bar_counts_from_the_launch_as_the_header_does() -> None:
    # a new user's tryout (2026-11-26): paused, the header said 0:08 and the replay bar
    # "REPLAY paused 1× 0:07 / 2:29": the bar counted from the first message, the header from
    # the launch (the agent's first Phase names it, ~1 s before its first message)
    import re

    from tpuwatch.protocol import Phase

    messages = recording("healthy_4replica")
    t0 = next(m.t for m in messages if hasattr(m, "t"))
    messages = [Phase(t=t0, phase="starting", since=t0 - 1.5), *messages]
    clock = FakeClock(100.0)
    source = ReplaySource(messages, speed=1.0, clock=clock)
    app = TpuwatchApp(source, refresh_hz=0)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        clock.t += 6.0
        app.pull()
        await pilot.press("space")
        await pilot.pause()
        text = screen_text(app)
        bars = re.findall(r"paused 1×\s+(\d+:\d\d) / (\d+:\d\d)", text)
        assert len(bars) == 1, text
        (bar,) = bars
        elapsed = units.clock(app.snapshot.now - app.snapshot.started_t)
        assert bar[0] == elapsed, (bar, elapsed, text)

"""The dashboard in a user's hands, round 2, every key consistent."""

from __future__ import annotations

import pytest
from ui_support import screen_text, sync, until_shown

from tpuwatch.ui.widgets.panel import Panel

# --- each expanded panel closes the same way -----------------


@pytest.mark.parametrize("close", ["z", "enter", "escape", "q"])
@sync
async def test_expanded_retraces_closes_like_every_panel(live_app, close) -> None:
    app = live_app(upto=300)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("6", "z")
        await pilot.pause()
        retraces = app.query_one("#retraces")
        assert retraces.has_class("-maximised") and app.screen is app.screen_stack[0]
        text = screen_text(app)
        assert "2 trace(s), oldest first" in text and "x: shape (16, 28, 28, 1) -> (8, 28, 28, 1)" in text
        assert "esc Back" in text.splitlines()[-1]  # the footer says how to get back
        await pilot.press(close)
        await pilot.pause()
        assert not app.query(".-maximised") and not app.screen.has_class("-panel-max")
        assert app.return_value is None and len(app.screen_stack) == 1  # q closed it, did not quit
        assert "esc Back" not in screen_text(app).splitlines()[-1]


@pytest.mark.parametrize("panel", ["1", "2", "3", "4", "5", "6", "7"])
@sync
async def test_every_panel_closes_with_escape_and_q_and_keeps_other_keys(live_app, panel) -> None:
    app = live_app(upto=300)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press(panel, "z")
        await pilot.pause()
        assert app.query(".-maximised")
        assert "esc Back" in screen_text(app).splitlines()[-1]
        await pilot.press("escape")
        await pilot.pause()
        assert not app.query(".-maximised")
        await pilot.press(panel, "z", "?")  # another key still works on an expanded panel
        await pilot.pause()
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("escape", "q")
        await pilot.pause()
        assert not app.query(".-maximised") and app.return_value is None


# --- panel titles carry the number that jumps to them ------------------------------------


@sync
async def test_panel_titles_carry_their_number(live_app) -> None:
    from tpuwatch.ui.app import PANEL_IDS, panel_key

    app = live_app(upto=300)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        for i, pid in enumerate(PANEL_IDS):
            widget = app.query_one(f"#{pid}")
            owner = widget if isinstance(widget, Panel) else widget.parent
            assert str(owner.border_title).startswith(f"{panel_key(i)} "), (pid, owner.border_title)


# --- replay starts at 1x, its hint fits 80 columns, arrows seek 5% of the run ------------


def test_replay_starts_at_real_speed() -> None:
    from tpuwatch.cli import _parser

    ns = _parser().parse_args(["replay", "some-run"])
    assert ns.speed == 1.0


def test_replay_line_fits_80_columns_at_its_longest() -> None:
    from tpuwatch.ui.widgets.replay_bar import ReplayState, replay_text

    longest = ReplayState(paused=True, speed=0.25, position_s=35_999.0, duration_s=35_999.0, at_end=False)
    text = replay_text(longest).plain
    assert len(text) <= 80, (len(text), text)
    assert "seek" in text and "space" in text


def test_an_arrow_seeks_a_twentieth_of_the_recording() -> None:
    from ui_support import FakeClock

    from tpuwatch.protocol import Step
    from tpuwatch.sources.replay_source import ReplaySource

    steps = [Step(step=i, t=1000.0 + 2 * i, step_time_s=2.0, input_wait_s=0.0, loss=1.0) for i in range(101)]
    source = ReplaySource(steps, paused=True, clock=FakeClock(0.0))
    assert source.seek_step_s == pytest.approx(10.0)  # 200 s recorded: 5% is 10 s (5 steps)
    source.seek(source.seek_step_s)
    assert source.position - source.start_t == pytest.approx(source.seek_step_s)


# --- the room used, an x-axis, every glyph explained, Retraces columns whole ----------


def _panel_lines(app, pid: str) -> list[str]:
    region = app.query_one(f"#{pid}").region
    lines = screen_text(app).splitlines()[region.y: region.y + region.height]
    return [line[region.x: region.x + region.width] for line in lines]


@sync
async def test_expanded_loss_chart_uses_the_height(live_app) -> None:
    app = live_app(upto=300)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("2", "z")
        await pilot.pause()
        chart_rows = [line for line in _panel_lines(app, "loss") if "█" in line]
        assert len(chart_rows) >= 20, len(chart_rows)


@sync
async def test_expanded_step_time_has_a_step_axis_and_a_legend(live_app) -> None:
    app = live_app(upto=300)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert not any(line.strip(" ┃").strip() == "100%" for line in _panel_lines(app, "step-time"))
        await pilot.press("1", "z")
        await pilot.pause()
        lines = _panel_lines(app, "step-time")
        axis = [line for line in lines if "step 1 " in line]
        assert axis and axis[0].rstrip(" ┃").endswith(str(app.snapshot.history[-1].step)), lines
        assert any("w: input wait, share of each step (full height 100%)" in line for line in lines)


@sync
async def test_help_explains_the_chart_glyphs(live_app) -> None:
    app = live_app(upto=300)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        rows = {keys: text for keys, text, _ in app.key_rows()}
        assert "tracing" in rows["▲ (chart)"] and "100%" in rows["w (chart)"]
        assert rows["esc"] and all(enabled for keys, _, enabled in app.key_rows() if keys == "esc")


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
@sync
async def test_retraces_columns_are_not_cut(live_app, size) -> None:
    app = live_app(upto=300)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        if size == (80, 24):
            await pilot.press("6")  # no room at 80x24: shown expanded
            await pilot.pause()
        text = "\n".join(_panel_lines(app, "retraces"))
        assert "…" not in text, text
        assert "traces" in text or "trace 2" in text
        flat = " ".join(part.strip(" │┃") for part in text.splitlines())
        assert "(16, 28, 28, 1) -> (8, 28, 28, 1)" in flat.replace("  ", " "), flat


# --- re-attaching says it is catching up, and shows no old step as current ----------------


@sync
async def test_reattach_says_catching_up_until_the_backlog_is_read(live_app, monkeypatch) -> None:
    import tpuwatch.sources.file_source as file_source
    import tpuwatch.ui.source_reader as source_reader

    monkeypatch.setattr(file_source, "POLL_BYTES", 8 << 10)  # the recording: ~15 reads
    monkeypatch.setattr(source_reader, "APPLY_BUDGET_S", -1.0)  # one read per refresh
    app = live_app(upto=300)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        header = screen_text(app).splitlines()[:2]
        assert "CATCHING UP" in header[0], header
        assert "catching up" in header[1] and "steps/s" not in header[1] and "ETA" not in header[1], header
        for _ in range(100):
            if not app.snapshot.catching_up:
                break
            app.pull()
            await pilot.pause()
        header = screen_text(app).splitlines()[:2]
        assert "RUNNING" in header[0] and "step 182/300" in header[1], header


# --- on a CPU host the Memory panel says why device memory is missing, charts RSS and CPU --


def _cpu_host_state():
    from tpuwatch.monitor.state import RunState
    from tpuwatch.protocol import Event, EventFact, HostSample

    state = RunState(clock=lambda: 1060.0)
    state.apply(Event(t=1000.0, level="info", source="probe:memory", message="no memory info for CPU:0: ...",
                      fact=EventFact.DEVICE_MEMORY_UNAVAILABLE, subject="CPU:0",
                      reason="Not supported on this device"))
    for i in range(60):
        cpu = 0.0 if i >= 50 else 180.0  # the process stops computing: the clue of a pause
        state.apply(HostSample(t=1000.0 + i, rss_bytes=(1 << 30) + i * (8 << 20), available_bytes=6 << 30,
                               total_bytes=8 << 30, cpu_percent=cpu, load_1m=1.5))
    return state


def test_host_samples_keep_a_history_and_the_typed_reason() -> None:
    snap = _cpu_host_state().snapshot(now=1060.0)
    assert len(snap.host_history) == 60 and snap.host_history[-1].cpu_percent == 0.0
    assert snap.host_memory[0].load_1m == 1.5
    assert snap.device_memory_notes == ("CPU:0: Not supported on this device",)


def test_a_recorded_host_sample_without_load_still_reads() -> None:
    from tpuwatch.protocol import HostSample, decode

    line = b'{"kind":"host_sample","t":1.0,"rss_bytes":1,"available_bytes":2,"total_bytes":3,"cpu_percent":4.0}'
    msg = decode(line)
    assert isinstance(msg, HostSample) and msg.load_1m is None


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
@sync
async def test_cpu_host_memory_panel_says_why_and_charts_rss_and_cpu(live_app, size) -> None:
    import dataclasses

    app = live_app(upto=300)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        cpu = _cpu_host_state().snapshot(now=1060.0)
        app.snapshot = dataclasses.replace(
            app.snapshot, device_memory=(), host_memory=cpu.host_memory, host_history=cpu.host_history,
            device_memory_notes=cpu.device_memory_notes)
        if size == (80, 24):
            await pilot.press("3", "z")  # little room at 80x24: the charts show expanded
        await pilot.pause()
        text = "\n".join(_panel_lines(app, "memory"))
        assert "no device memory: CPU:0" in text, text  # one line: the whole reason expanded
        assert "0% CPU · load 1.50" in text, text
        assert " rss " in text and "cpu%" in text, text
        assert sum("█" in line for line in text.splitlines()) >= 2, text


def test_an_older_recording_says_why_device_memory_is_missing_in_words() -> None:
    from tpuwatch.protocol import Event, EventFact, event_fact

    old = Event(t=1.0, level="info", source="probe:memory",
                message="no memory info for CPU:0: Not supported on this device")
    assert event_fact(old) == (EventFact.DEVICE_MEMORY_UNAVAILABLE, "CPU:0", "Not supported on this device")


@sync
async def test_a_cpu_allocator_without_statistics_counts_as_missing(live_app) -> None:
    # What a real Keras fit on a CPU host records (TF 2.21): CPU:0 sampled at 0 B current and peak.
    import dataclasses

    from tpuwatch.monitor.snapshot import DeviceMemory

    app = live_app(upto=300)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        cpu = _cpu_host_state().snapshot(now=1060.0)
        zero = DeviceMemory(device="CPU:0", worker="vm:1", current_bytes=0, peak_bytes=0, limit_bytes=None,
                            source="tf", limit_source="", duty_cycle_pct=None, t=1059.0)
        app.snapshot = dataclasses.replace(app.snapshot, device_memory=(zero,), host_memory=cpu.host_memory,
                                           host_history=cpu.host_history, device_memory_notes=())
        await pilot.pause()
        text = "\n".join(_panel_lines(app, "memory"))
        assert "no device memory: CPU:0" in text and "peak 0 B" not in text, text
        assert " rss " in text and "cpu%" in text, text


@pytest.mark.parametrize("close", ["z", "enter", "escape", "q"])
@sync
async def test_the_results_list_closes_with_the_same_keys_as_a_panel(live_app, close) -> None:
    app = live_app(upto=300)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("r")
        await pilot.pause()
        assert len(app.screen_stack) == 2
        await pilot.press(close)
        await pilot.pause()
        assert len(app.screen_stack) == 1 and app.return_value is None


@sync
async def test_at_step_4_the_input_panel_says_the_wait_is_measured_not_that_it_is_not(live_app) -> None:
    """At step 4 the Step-time panel drew a wait line and Goodput booked "input wait 0.1%", while the
    Input panel said "input wait not measured" (the share is judged from 20 steps)."""
    app = live_app(upto=25)  # hello ... and the first 4 steps, each with its wait
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.snapshot.step == 4 and app.snapshot.input_wait is None
        body = str(app.query_one("#input").query_one(".body").render())
        assert "not measured" not in body
        assert "input wait measured; too few steps to judge (20 needed)" in body


@sync
async def test_the_stack_dumps_result_stays_in_its_window_not_in_a_toast_over_it(live_app, sent) -> None:
    """The result of `s` popped up as a toast over the stacks window that shows it."""
    from tpuwatch.protocol import Result, StackDump
    from tpuwatch.ui.screens.stack_screen import StackScreen

    app = live_app(upto=150)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("s")
        await app.workers.wait_for_complete()
        assert isinstance(app.screen, StackScreen)
        said: list[str] = []
        notify = app.notify
        app.notify = lambda message, **kw: (said.append(message), notify(message, **kw))[1]  # type: ignore[method-assign]
        cid = sent[0].id
        now = app.snapshot.now
        app._state.apply(StackDump(t=now, text="Thread MainThread (training)\n  train.py:40 in <module>\n",
                                   path="/r/stacks/20261127-100000-x.txt"))
        app._state.apply(Result(t=now, id=cid, action="stack_dump", ok=True,
                                message="stack dump written to /r/stacks/20261127-100000-x.txt",
                                details={"path": "/r/stacks/20261127-100000-x.txt"}))
        app.pull()
        shown = await until_shown(pilot, app, "train.py:40 in <module>")
        await pilot.pause(0.2)
        assert "train.py:40 in <module>" in shown and isinstance(app.screen, StackScreen)
        assert not [m for m in said if "stack" in m], said


@sync
async def test_9_then_esc_at_80x24_gives_the_focus_back_to_the_panel_that_had_it(live_app) -> None:
    """At 80x24 the Goodput panel has no room: `9` shows it expanded, esc puts it back, and the focus
    stayed on the hidden panel: panel 1 lost its focus border and no panel had one."""
    app = live_app(upto=300)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("1")
        await pilot.pause()
        step_panel = app.query_one("#step-time")
        assert step_panel.has_focus
        await pilot.press("9")
        await pilot.pause()
        assert app.query_one("#goodput").has_class("-maximised")
        await pilot.press("escape")
        await pilot.pause()
        await pilot.pause()
        assert not app.query_one("#goodput").has_class("-maximised")
        assert step_panel.has_focus, app.focused


@sync
async def test_the_memory_panel_says_logical_cpu_devices_share_one_allocator(live_app) -> None:
    """At 80x24 the Memory panel listed CPU:0 and "… 3 more devices" without saying that TensorFlow's
    logical CPU devices are one host allocator."""
    app = live_app(upto=300)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        body = str(app.query_one("#memory").query_one(".body").render())
        assert "… 3 more CPUs: one shared allocator" in body, body
        assert app.query_one("#memory").query_one(".body").size.width >= len("… 3 more CPUs: one shared allocator")


@sync
async def test_the_expanded_input_panel_keeps_each_stage_on_one_line_at_80_columns(live_app) -> None:
    """A stage with long settings wrapped onto a second line in the expanded Input panel at 80 columns,
    under the next stage's column."""
    from tpuwatch.protocol import Pipeline

    app = live_app(upto=300)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        app._state.apply(Pipeline(
            t=app.snapshot.now, dataset=1, consumer="experimental_distribute_dataset",
            stages=("TFRecordDataset", "map", "batch", "prefetch"),
            sites=("recipe_tfrecords.py:118", "recipe_tfrecords.py:119", "recipe_tfrecords.py:121",
                   "recipe_tfrecords.py:122"),
            settings=("num_parallel_reads=AUTOTUNE", "num_parallel_calls=AUTOTUNE, deterministic='default'",
                      "batch_size=64, drop_remainder=True", "buffer_size=AUTOTUNE"),
            code=("", "", "", ""), holds_bytes=(0, 0, 0, -1), added_by=("", "", "", ""), use="train"))
        app.pull()
        await pilot.press("5")
        await pilot.pause()
        panel = app.query_one("#input")
        assert panel.has_class("-maximised")
        rows = [line.strip("┃│ ") for line in screen_text(app).splitlines()]
        (stage,) = [r for r in rows if "recipe_tfrecords.py:119" in r]
        assert stage.startswith("recipe_tfrecords.py:119") and ".map(num_parallel_calls=AUTOTUNE" in stage, rows
        following = rows[rows.index(stage) + 1]
        assert following.startswith("recipe_tfrecords.py:121"), rows  # not the rest of the map's settings


@sync
async def test_held_on_a_search_match_the_output_says_new_lines_arrive_below(live_app) -> None:
    """The Output panel stays on a search match while the run goes on writing, with no sign of the
    lines arriving below it."""
    from tpuwatch.ui.widgets.output_panel import OutputPanel

    output = "".join(f"line {i}\n" for i in range(200)) + "needle here\n" + "".join(f"tail {i}\n" for i in range(50))
    app = live_app(output=output)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("o", "slash", *"needle", "enter")
        await pilot.pause()
        panel = app.query_one(OutputPanel)
        assert "1/1" in str(panel.border_subtitle)
        panel.append([f"new {i}" for i in range(7)])
        await pilot.pause()
        assert "needle here" in screen_text(app)  # still on the match
        assert "7 new lines below" in str(panel.border_subtitle), panel.border_subtitle
        panel.log_view.scroll_end(animate=False, immediate=True)
        await pilot.pause()
        assert "new lines below" not in str(panel.border_subtitle), panel.border_subtitle

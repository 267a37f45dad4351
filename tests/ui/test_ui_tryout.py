"""What a new user met at 80x24 (help, command results, the results list, l, an ended run, wording)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from ui_support import FakeClock, last_t, make_live_run, recording, screen_text, sync, until_shown

from tpuwatch import protocol, rundir
from tpuwatch.sources.file_source import FileSource
from tpuwatch.ui import app as app_module
from tpuwatch.ui.app import TpuwatchApp
from tpuwatch.ui.screens.help_screen import HelpScreen


def _append(run: Path, msg: protocol.Message) -> None:
    """A message arriving through the recording, as it does live."""
    with open(run / rundir.EVENTS, "ab") as f:
        f.write(protocol.encode(msg))


@pytest.mark.parametrize("name", ["healthy_4replica", "crashed"])  # a tall help and a shorter one
@sync
async def test_help_at_80x24_shows_every_description_whole_and_one_bottom_border(live_app, name) -> None:
    app = live_app(name, upto=None if name == "crashed" else 200)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = screen_text(app)
        assert "…" not in text.replace("1 … 9, 0", "").replace("findings, …", "")
        words = " ".join(text.replace("│", " ").split())
        for whole in ("whole screen (it scrolls); again to restore", "stacks) with full paths",
                      *(["(a stalled or hung run)"] if name != "crashed" else [])):
            assert whole in words
        lines = text.splitlines()
        bottoms = [i for i, line in enumerate(lines) if line.startswith(("╰", "┗"))]
        assert not any(b + 1 in bottoms for b in bottoms), text


@sync
async def test_a_result_line_goes_after_a_while_and_stays_in_the_results_list(live_app) -> None:
    # healthy_4replica's checkpoint ended 2 s before this point of the recording.
    app = live_app(upto=300)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert "checkpoint done" in screen_text(app)
        output_rows = app.query_one("#output").size.height
        app._clock.t += 15
        app.pull()
        await pilot.pause()
        assert "checkpoint done" not in screen_text(app)
        assert not app.query_one("#commands").display
        assert app.query_one("#output").size.height > output_rows
        await pilot.press("p")  # no answer comes: in flight, it stays
        app._clock.t += 15
        app.pull()
        await pilot.pause()
        assert "profile sent…" in screen_text(app)
        await pilot.press("r")
        await pilot.pause()
        assert "checkpoint saved at step 150" in screen_text(app)


@sync
async def test_results_list_names_each_path_once(live_app, sent) -> None:
    app = live_app(upto=150)
    run = app.run_dir
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        await pilot.press("c")
        await app.workers.wait_for_complete()
        path = str(run / "checkpoints" / "ckpt-4268")
        result = protocol.Result(t=app.snapshot.now, id=sent[0].id, action="checkpoint", ok=True,
                                 message=f"saved step 4268 (model) to {path}",
                                 details={"path": path, "bytes": 3 << 20, "step": 4268})
        _append(run, result)
        app.pull()
        await pilot.press("r")
        await pilot.pause()
        text = screen_text(app)
        assert "saved step 4268 (model) to" in text
        assert text.count("ckpt-4268") == 1, text


@sync
async def test_l_at_80x24_shows_the_loss_chart_then_changes_its_scale(live_app) -> None:
    app = live_app(upto=300)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        bars = app.query_one("#loss-bars")
        assert not bars.region.area  # no room for it at this size
        await pilot.press("l")
        await pilot.pause()
        assert bars.region.area and bars.display
        panel = app.query_one("#loss")
        assert panel.scale == "recent" and "l: scale" in panel.border_subtitle
        await pilot.press("l")
        await pilot.pause()
        assert panel.scale == "log"
        await pilot.press("z")
        await pilot.pause()
        assert not bars.region.area


@sync
async def test_an_ended_run_offers_no_live_actions_and_a_key_says_why(live_app, sent) -> None:
    app = live_app("crashed", upto=None)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.snapshot.status == "crashed"
        footer = screen_text(app).splitlines()[-1]
        for gone in ("Profile", "Checkpoint", "Detach"):
            assert gone not in footer, footer
        assert "Quit" in footer
        palette = {c.title for c in app.get_system_commands(app.screen)}
        assert not palette & {"Profile", "Checkpoint", "Stacks", "Detach"}, palette
        for key in ("p", "c", "s", "d"):
            await pilot.press(key)
            await pilot.pause()
        assert not sent and app.return_value is None
        said = [n.message for n in app._notifications]
        assert len(said) == 4 and all("crashed" in m and len(m) <= 36 for m in said), said


@sync
async def test_a_long_retrace_signature_is_cut_on_its_line_keeping_its_replica_count(live_app) -> None:
    app = live_app(upto=300)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        for _ in range(50):  # a loaded box can cut the first read short (the app catches up later)
            if not app.snapshot.catching_up:
                break
            app.pull()
            await pilot.pause()
        first = app.snapshot.retraces[0]
        long = "x: float32[16, 28, 28, 1] x4, y: int64[16] x4, sample_weight: float32[16, 1, 1, 1] x4"
        app.snapshot = dataclasses.replace(app.snapshot, retraces=(dataclasses.replace(first, signature=long),))
        await pilot.press("6")  # hidden at 80x24: shown expanded
        lines = (await until_shown(pilot, app, "signature")).splitlines()
        (signature,) = [line for line in lines if "signature" in line]
        assert "…" in signature and signature.rstrip(" │┃").endswith("… x4"), signature
        assert not any(line.strip(" │┃") == "x4" for line in lines)


@sync
async def test_steps_without_input_wait_say_not_measured(tmp_path) -> None:
    # A run with no tf.data input: its steps carry no input wait.
    run = make_live_run(tmp_path, "crashed")
    lines = (run / rundir.EVENTS).read_text().splitlines()
    stripped = [json.dumps({**d, "input_wait_s": None} if "input_wait_s" in d else d) for d in map(json.loads, lines)]
    (run / rundir.EVENTS).write_text("\n".join(stripped) + "\n")
    app = TpuwatchApp(FileSource(run), run_dir=run, clock=FakeClock(last_t(recording("crashed")) + 0.5),
                      refresh_hz=0)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.snapshot.step > 0 and app.snapshot.input_wait_frac is None
        text = screen_text(app)
        assert "no data yet" not in text and "wait not measured" in " ".join(text.split()), text


# --- the README's first command tried at 80x24 in tmux, round 3 ------------------------------------


@sync
async def test_help_says_how_to_close_it_without_scrolling(live_app) -> None:
    # At 80x24 the help's closing line was below the fold and the footer is covered: no way back shown.
    app = live_app(upto=200)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        last = screen_text(app).splitlines()[-1]
        assert "esc" in last and "close" in last, last


@pytest.mark.parametrize("keys", [("o",), ("8", "z")])
@sync
async def test_maximised_output_goes_back_with_escape_and_the_footer_says_so(live_app, keys) -> None:
    # The focused output log's own esc (close the search) took the key: esc did nothing, the footer
    # showed no way back.
    app = live_app(upto=200, output="".join(f"line {i}\n" for i in range(100)))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press(*keys)
        await pilot.pause()
        assert app.screen.has_class("-output-max")
        assert "esc Back" in screen_text(app).splitlines()[-1]
        await pilot.press("escape")
        await pilot.pause()
        assert not app.screen.has_class("-output-max")
        assert "esc Back" not in screen_text(app).splitlines()[-1]
        # with a search shown, esc clears the search first, then puts the output back
        await pilot.press("o", "slash", *"line 9", "enter")
        await pilot.pause()
        assert "/line 9" in str(app.query_one("#output").border_subtitle)
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen.has_class("-output-max") and not str(app.query_one("#output").border_subtitle)
        await pilot.press("escape")
        await pilot.pause()
        assert not app.screen.has_class("-output-max")


@pytest.mark.parametrize("first", ["o", "5", "9"])  # the output maximised, a hidden panel shown expanded
@sync
async def test_a_number_key_on_the_maximised_output_goes_to_that_panel_unexpanded(live_app, first) -> None:
    app = live_app(upto=200)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press(first, "1")
        await pilot.pause()
        panel = app.query_one("#step-time")
        assert not app.screen.has_class("-output-max")
        assert not panel.has_class("-maximised") and app.focused is panel


@sync
async def test_the_input_panel_has_no_lone_scale_label(live_app) -> None:
    app = live_app("input_bound", upto=400)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("5")  # hidden at 80x24: shown expanded
        await pilot.pause()
        text = screen_text(app)
        assert app.query_one("#input").has_class("-maximised")
        # 100% appears only where it is explained: the legend naming the strip's scale
        for line in text.splitlines():
            if "100%" in line:
                assert "w: input wait, share of each step (full height 100%)" in line, line
        assert "full height 100%" in text


@sync
async def test_the_workers_panel_carries_its_number_and_0_jumps_there(live_app) -> None:
    app = live_app(upto=200)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        panel = app.query_one("#workers")
        assert str(panel.border_title) == "0 Workers"
        await pilot.press("0")  # one worker: the panel is not shown and the key does nothing
        await pilot.pause()
        assert app.focused is not panel and not app.query(".-maximised")
        hello = next(m for m in recording("healthy_4replica") if isinstance(m, protocol.Hello))
        app._state.apply(dataclasses.replace(hello, host="h", pid=2), worker="h:2")  # a second worker
        app.pull()
        await pilot.pause()
        assert len(app.snapshot.workers) == 2
        await pilot.press("0")
        await pilot.pause()
        assert app.focused is panel
        await pilot.press("question_mark")
        await pilot.pause()
        assert "1 … 9, 0" in screen_text(app)


@sync
async def test_the_findings_marks_are_explained_in_the_help(live_app) -> None:
    app = live_app("input_bound", upto=400)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert "!  highly input-bound" in screen_text(app)  # the mark a new user sees first
        await pilot.press("question_mark", "end")
        await pilot.pause()
        rows = [" ".join(line.strip("│┃ ").split()) for line in screen_text(app).splitlines()]
        assert "!!, !, i Findings: critical, warning, information" in rows, rows


@sync
async def test_output_lines_wider_than_the_panel_say_so_and_scroll(live_app) -> None:
    # Keras' progress line is 80 columns: the accuracy was cut at 80x24 with nothing saying so.
    wide = "100/100 - 15s - 152ms/step - loss: 0.4131 - sparse_categorical_accuracy: 0.8598\n"
    app = live_app(upto=200, output="Epoch 8/15\n" + wide)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        panel = app.query_one("#output")
        assert "lines cut: ←/→ scroll" in str(panel.border_subtitle)
        assert "lines cut" in screen_text(app)
        await pilot.press("8", "right", "right", "right")
        await pilot.pause()
        assert app.query_one("#output-log").scroll_x > 0
        assert "0.8598" in screen_text(app)
        await pilot.press("o", "slash", *"loss", "enter")  # the search's matches take the subtitle
        await pilot.pause()
        assert str(panel.border_subtitle).startswith("/loss")


@sync
async def test_output_lines_that_fit_say_nothing(live_app) -> None:
    app = live_app(upto=200, output="Epoch 8/15\nshort\n")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert not str(app.query_one("#output").border_subtitle)


@sync
async def test_l_at_80x24_shows_the_chart_on_screen_after_many_epochs() -> None:
    # a new user's tryout (2026-11-26), the README sample (15 epochs): `l` said "loss chart,
    # expanded: z puts it back" but the expanded panel showed the replica rows and the per-epoch
    # table, the chart below them only after PageDown
    from ui_support import FakeClock, recording

    from tpuwatch.protocol import Epoch
    from tpuwatch.sources.replay_source import ReplaySource
    from tpuwatch.ui.app import TpuwatchApp

    messages = list(recording("healthy_4replica")[:250])
    t = max(m.t for m in messages if hasattr(m, "t"))
    messages += [Epoch(t=t + 0.01 * i, epoch=i, phase="end", step=10 * (i + 1), logs={"loss": 1.0 / (i + 1)})
                 for i in range(15)]
    source = ReplaySource(messages, speed=1.0, clock=FakeClock(0.0))
    app = TpuwatchApp(source, refresh_hz=0)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("end")
        await pilot.pause()
        await pilot.press("l")
        await pilot.pause()
        region = app.query_one("#loss").region
        lines = screen_text(app).splitlines()[region.y: region.y + region.height]
        assert any("█" in line[region.x: region.x + region.width] for line in lines), "\n".join(lines)


@sync
async def test_a_command_the_agent_never_took_frees_its_key_and_says_so(live_app, sent) -> None:
    # The agent skips commands past the budget all viewers share, without a result: the profile
    # key stayed "sent…" and refused every press for the rest of the run.
    app = live_app(upto=300)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("p")
        await app.workers.wait_for_complete()
        assert len(sent) == 1 and "profile sent…" in screen_text(app)
        app._clock.t += app_module.COMMAND_ACK_S + 1
        app.pull()
        await pilot.pause()
        text = screen_text(app)
        assert "profile sent…" not in text
        assert "no answer from the agent" in text, text
        await pilot.press("p")  # pressed again: sent again
        await app.workers.wait_for_complete()
        assert len(sent) == 2 and sent[1].id != sent[0].id


@sync
async def test_a_command_the_agent_queued_stays_in_flight(live_app, sent) -> None:
    app = live_app(upto=300)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("p")
        await app.workers.wait_for_complete()
        _append(app.run_dir, protocol.CommandState(t=app.snapshot.now, id=sent[0].id, action="profile",
                                                   state="queued", step=300))
        app._clock.t += app_module.COMMAND_ACK_S + 1
        app.pull()
        await pilot.pause()
        await pilot.press("p")  # still in flight: not sent twice
        await app.workers.wait_for_complete()
        assert len(sent) == 1
        assert "no answer from the agent" not in screen_text(app)

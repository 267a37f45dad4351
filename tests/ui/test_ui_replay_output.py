"""Replay: the Output panel follows the replay position, not the end of the log, and
the replay_output rules behind it."""

from __future__ import annotations

from ui_support import FakeClock, recording, sync

from tpuwatch import rundir
from tpuwatch.sources.replay_source import ReplaySource
from tpuwatch.ui.app import TpuwatchApp
from tpuwatch.ui.replay_output import epoch_anchors, visible_lines
from tpuwatch.ui.widgets.output_log import OutputLog, is_native_log

OUTPUT = ("I0000 00:00:1750000001.1 cudart_stub.cc:29] Could not find cuda drivers\n"
          "strategy: MirroredStrategy, 4 replicas\n"
          "Epoch 1/3\n100/100 - 5s - 50ms/step - loss: 1.2732\n"
          "Epoch 2/3\n100/100 - 5s - 50ms/step - loss: 0.7067\n"
          "Epoch 3/3\n100/100 - 5s - 50ms/step - loss: 0.4102\n"
          "done: 300 steps\n")


@sync
async def test_replay_output_follows_the_position_forward_and_back(tmp_path) -> None:
    run = tmp_path / "run"
    rundir.create(run)
    (run / rundir.OUTPUT).write_text(OUTPUT)
    source = ReplaySource(recording("healthy_4replica"), paused=True, clock=FakeClock(0.0))
    app = TpuwatchApp(source, run_dir=run, refresh_hz=0)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        log = app.query_one(OutputLog)
        # At the start, before any epoch began: only the lines before "Epoch 1/3".
        assert list(log.lines) == OUTPUT.splitlines()[:2]
        source.seek(3.0)  # into epoch 1 (it began at +1.5 s)
        app.pull()
        assert list(log.lines)[-1] == "Epoch 1/3" and "Epoch 2/3" not in log.lines
        source.seek(6.0)  # into epoch 2: epoch 1's summary line is there now
        app.pull()
        assert list(log.lines)[-2:] == ["100/100 - 5s - 50ms/step - loss: 1.2732", "Epoch 2/3"]
        source.seek(-8.0)  # back to the start: the log starts over
        app.pull()
        assert list(log.lines) == OUTPUT.splitlines()[:2]
        source.seek_end()
        app.pull()
        assert list(log.lines) == OUTPUT.splitlines()


def test_visible_lines_without_anchors_is_proportional() -> None:
    assert epoch_anchors(["a", "Epoch 1/2", "b", "Epoch 2/2"]) == [1, 3]
    assert visible_lines(100, [], 0, 0, 0.25, ended=False) == 25
    assert visible_lines(100, [], 0, 0, 0.25, ended=True) == 100
    assert visible_lines(10, [2, 6], 0, 0, 0.9, ended=False) == 2  # before the first epoch
    assert visible_lines(10, [2, 6], 1, 0, 0.0, ended=False) == 3  # its header
    assert visible_lines(10, [2, 6], 1, 1, 0.0, ended=False) == 6  # and its summary
    assert visible_lines(10, [2, 6], 2, 2, 0.0, ended=False) == 10


@sync
async def test_tensorflow_log_lines_are_dimmed_and_f_folds_them(live_app) -> None:
    from ui_support import screen_text

    native = ["I0000 00:00:1750000001.123456   4242 cudart_stub.cc:29] Could not find cuda drivers on your machine",
              "2025-06-15 12:00:01.123456: I tensorflow/core/platform/cpu_feature_guard.cc:210] This TensorFlow binary"]
    app = live_app(upto=200, output="\n".join([*native, "strategy: MirroredStrategy", "Epoch 1/3"]) + "\n")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        log = app.query_one(OutputLog)
        assert [is_native_log(line) for line in log.lines] == [True, True, False, False]
        assert log.highlighter.native_style is not None and log.highlighter.native_style.dim  # drawn dimmed
        assert "cudart_stub.cc" in screen_text(app)
        await pilot.press("f")
        await pilot.pause()
        assert list(log.lines) == ["strategy: MirroredStrategy", "Epoch 1/3"]
        assert "2 TensorFlow log lines folded" in str(app.query_one("#output").border_title)
        with open(app.run_dir / "output.log", "a") as f:
            f.write(native[0] + "\nEpoch 2/3\n")
        app.pull()
        assert list(log.lines)[-1] == "Epoch 2/3" and not any("cudart" in line for line in log.lines)
        await pilot.press("f")
        assert len(log.lines) == 6


@sync
async def test_a_replays_cut_lines_say_where_they_are_whole(tmp_path) -> None:
    # In a replay the arrows seek: the live hint (arrows scroll) would be wrong.
    run = tmp_path / "run"
    rundir.create(run)
    (run / rundir.OUTPUT).write_text("x" * 300 + "\n")
    source = ReplaySource(recording("healthy_4replica"), paused=True, clock=FakeClock(0.0))
    app = TpuwatchApp(source, run_dir=run, refresh_hz=0)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        source.seek_end()
        app.pull()
        await pilot.pause()
        assert app.query_one(OutputLog).lines
        assert str(app.query_one("#output").border_subtitle) == "lines cut: whole in output.log"

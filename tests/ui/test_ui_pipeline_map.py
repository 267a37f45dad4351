"""The Input panel, expanded, shows the pipeline map with the stage input-bound blames."""

from __future__ import annotations

from dataclasses import replace

from tpuwatch.monitor.diagnostics.input_share import InputShare
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.protocol import Finding, Pipeline
from tpuwatch.ui.widgets.input_panel import input_text

PIPE = Pipeline(t=0.0, dataset=1, consumer="experimental_distribute_dataset",
                stages=("from_tensor_slices", "map", "cache", "batch", "prefetch"),
                sites=("train.py:40", "train.py:41", "train.py:42", "train.py:43", "train.py:44"),
                settings=("", "", "filename=''", "batch_size=64, drop_remainder=True", "buffer_size=2"),
                code=("", "", "", "", ""), holds_bytes=(0, 0, 100 << 20, 0, 0), added_by=("",) * 5)


def snapshot(**kw) -> RunSnapshot:
    share = InputShare(0.4, 0.02, 0.05, 100, 6, 106, "high")
    return replace(RunSnapshot(), step_time_s=0.05, input_recent=share, pipelines=(("h:1", PIPE),), **kw)


def test_the_map_shows_only_when_expanded():
    s = snapshot()
    assert "train.py:41" not in input_text(s).plain
    text = input_text(s, expanded=True).plain
    assert "dataset 1 · experimental_distribute_dataset" in text
    assert "train.py:41" in text and ".map()" in text and "holds ≤100" in text
    assert ".prefetch(buffer_size=2)" in text


def test_the_blamed_stage_carries_the_edit():
    f = Finding(t=0.0, rule="input-bound", severity="warning", message="m",
                advice=".map at train.py:41 runs one element at a time: add num_parallel_calls=tf.data.AUTOTUNE",
                evidence={"culprit_stage": "map", "culprit_site": "train.py:41"}, first_step=6, last_step=106,
                worker="h:1")
    text = input_text(snapshot(findings=(f,)), expanded=True).plain
    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if "train.py:41" in line)
    assert "num_parallel_calls=tf.data.AUTOTUNE" in lines[i + 1]


def test_z_on_the_input_panel_expands_it_into_the_map(live_app) -> None:
    import asyncio

    from ui_support import screen_text

    async def go() -> None:
        app = live_app(upto=200)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            app._state.apply(PIPE, worker=None)
            app.pull()
            await pilot.pause()
            assert "train.py:41" not in screen_text(app)
            await pilot.press("5")  # at a size with no room for it, this alone expands it
            await pilot.pause()
            panel = app.query_one("#input")
            if not panel.has_class("-maximised"):
                await pilot.press("z")
                await pilot.pause()
            assert panel.has_class("-maximised")
            body = str(panel.query_one(".body").render())
            assert "train.py:41" in body and ".map()" in body and ".cache(filename='')" in body

    asyncio.run(go())

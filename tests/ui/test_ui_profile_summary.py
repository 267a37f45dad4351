"""The profile summary modal and the choice of which profile results to show."""

from __future__ import annotations

import sys

from textual.app import App
from ui_support import sync

from tpuwatch.monitor.snapshot import CommandView, RunSnapshot
from tpuwatch.ui.screens.profile_summary_screen import (
    ProfileSummaryScreen,
    load_summary_text,
    new_profile_results,
)


def _view(id_: str, action: str = "profile", status: str = "done", **details) -> CommandView:
    return CommandView(id=id_, action=action, status=status, message="", details=details, t=1.0)  # type: ignore[arg-type]


def test_each_finished_profile_is_shown_once_and_only_those_sent_here():
    snap = RunSnapshot(commands=(_view("a"), _view("b", status="running"), _view("c", action="checkpoint"),
                                 _view("d"), _view("e", status="failed")))
    seen: set[str] = set()
    assert [c.id for c in new_profile_results(snap, seen, ids={"a", "b"})] == ["a"]
    assert [c.id for c in new_profile_results(snap, seen)] == ["d"]
    assert new_profile_results(snap, seen) == []


def test_a_capture_on_another_machine_says_how_to_open_it(tmp_path):
    text = load_summary_text(_view("a", path="gs://b/p/plugins/profile/x", logdir="gs://b/p"))
    assert "not on this machine" in text and "tensorboard --logdir=gs://b/p" in text
    empty = tmp_path / "plugins" / "profile" / "2026_01_01_00_00_00"
    empty.mkdir(parents=True)
    assert "No summary: no .xplane.pb" in load_summary_text(_view("b", local_path=str(empty)))


def test_without_xprof_the_popup_still_says_how_to_open_the_profile(tmp_path, monkeypatch):
    """README's first install (`.[tf]`) has no xprof: before, the popup said only "No summary"."""
    capture = tmp_path / "logs" / "plugins" / "profile" / "2026_01_01_00_00_00"
    capture.mkdir(parents=True)
    (capture / "host.xplane.pb").write_bytes(b"\0")
    monkeypatch.setitem(sys.modules, "xprof", None)  # import xprof raises ImportError
    monkeypatch.setitem(sys.modules, "xprof.convert", None)
    text = load_summary_text(_view("a", path=str(capture), local_path=str(capture), logdir=str(tmp_path / "logs")))
    assert "No summary: summaries need the xprof package" in text
    assert f"tensorboard --logdir={tmp_path / 'logs'}" in text
    assert f"xprof server --logdir={tmp_path / 'logs'}" in text
    # a capture made without a logdir in its details: the directory above plugins/profile
    assert f"tensorboard --logdir={tmp_path / 'logs'}" in load_summary_text(_view("b", local_path=str(capture)))


@sync
async def test_the_modal_shows_the_text_and_closes_with_escape():
    class Host(App):
        pass

    app = Host()
    async with app.run_test(size=(100, 30)) as pilot:
        app.push_screen(ProfileSummaryScreen("Profile /x\n  3 steps, step time 7.8 ms"))
        await pilot.pause()
        assert isinstance(app.screen, ProfileSummaryScreen)
        assert "3 steps, step time 7.8 ms" in str(app.screen.query_one("#profile-summary-text").render())
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ProfileSummaryScreen)


XCEPTION_OPS = ("block1_conv1/convolution", "block1_conv2/convolution", "block2_sepconv1/separable_conv2d",
                "block2_sepconv2/separable_conv2d", "block13_sepconv2_bn/FusedBatchNormV3")


def _xception_summary():
    from tpuwatch.monitor.profile_summary import OpTime, ProfileSummary

    prefix = "StatefulPartitionedCall/functional_1/xception_1/"
    ops = tuple(OpTime(name=prefix + name, op_type=name.rsplit("/", 1)[1][:16], where="Device",
                       self_ms=9.0 - i, share=0.2 - 0.02 * i, occurrences=3) for i, name in enumerate(XCEPTION_OPS))
    return ProfileSummary(path="/r/profiles/plugins/profile/2026_11_27_10_00_00", logdir="/r/profiles",
                          hardware="CPU", steps=(), step_avg_ms=40.0, step_min_ms=38.0, step_max_ms=44.0,
                          average_ms=(), input_percent=1.0, input_verdict="not", input_conclusion="",
                          bottleneck="", top_ops=ops, open_commands=("tensorboard --logdir /r/profiles",))


def _screen_words(svg: str) -> str:
    """The text an exported screenshot shows, its runs of text joined."""
    import html
    import re

    return "".join(html.unescape(t) for t in re.findall(r">([^<>]+)</text>", svg)).replace("\xa0", " ")


@sync
async def test_at_80_columns_the_top_ops_are_told_apart():
    """Each row was cut to the ops' shared prefix (StatefulPartitionedCall/functional_1/xception_1…): every
    row read the same. The shared prefix is said once; each row ends with what tells it apart."""
    from tpuwatch.monitor.profile_summary import render_text

    class Host(App):
        pass

    app = Host()
    async with app.run_test(size=(80, 24)) as pilot:
        width = ProfileSummaryScreen.text_width(app.size.width)
        app.push_screen(ProfileSummaryScreen(render_text(_xception_summary(), width=width)))
        await pilot.pause()
        await pilot.pause(0.2)
        shown = _screen_words(app.export_screenshot())
        for name in XCEPTION_OPS:
            assert name in shown, (name, shown)
        assert "StatefulPartitionedCall/functional_1/xception_1/" in shown

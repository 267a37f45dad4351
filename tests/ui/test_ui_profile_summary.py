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

"""Every command's result is visible whatever the width: a toast, one line per kind of command
with short paths, and the results screen with everything."""

from __future__ import annotations

from pathlib import Path

import pytest
from ui_support import screen_text, sync

from tpuwatch import protocol, rundir
from tpuwatch.monitor.snapshot import CommandView
from tpuwatch.ui.screens.profile_summary_screen import ProfileSummaryScreen
from tpuwatch.ui.screens.results_screen import ResultsScreen
from tpuwatch.ui.widgets.command_line import command_summary, short_path


def _answer(run: Path, command: protocol.Command, t: float, details: dict) -> None:
    """The agent's Result, arriving through the recording as it does live."""
    result = protocol.Result(t=t, id=command.id, action=command.action, ok=True,
                             message=f"{command.action} saved", details=details)
    with open(run / rundir.EVENTS, "ab") as f:
        f.write(protocol.encode(result))


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
@sync
async def test_profile_then_checkpoint_results_both_show(live_app, sent, size) -> None:
    app = live_app(upto=150)
    run = app.run_dir
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await pilot.press("p", "c")
        await app.workers.wait_for_complete()
        assert [c.action for c in sent] == ["profile", "checkpoint"]
        t = app.snapshot.now
        profile_dir = run / "profiles" / "plugins" / "profile" / "2026_11_23_02_40_00"
        _answer(run, sent[0], t, {"path": str(profile_dir), "seconds": 2.5})
        _answer(run, sent[1], t + 1, {"path": str(run / "checkpoints" / "ckpt-4268"), "bytes": 3 << 20,
                                      "seconds": 0.04, "step": 4268})
        app.pull()
        await pilot.pause()
        text = screen_text(app)
        assert "checkpoint done: checkpoints/ckpt-4268 · 3.00 MiB" in text
        assert "profile done: profiles/plugins/profile/" in text
        toasts = [n.message for n in app._notifications]
        assert any("checkpoint done: checkpoints/ckpt-4268" in m for m in toasts), toasts
        # the profile asked for here opens its summary by itself: no toast over it (a new user's
        # tryout, 2026-11-26: the toast hid the dialog's last lines)
        assert not any(m.startswith("profile done") for m in toasts), toasts
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, ProfileSummaryScreen)
        assert not list(app.screen.query("Toast")) or all(
            "profile" not in t.render().plain for t in app.screen.query("Toast"))
        await pilot.press("escape")  # the profile's summary opened by itself; close it
        await pilot.press("r")
        await pilot.pause()
        assert isinstance(app.screen, ResultsScreen)
        text = screen_text(app)
        assert str(run / "checkpoints" / "ckpt-4268") in text.replace("\n", "") or "ckpt-4268" in text
        assert "step 4268" in text and "checkpoint saved" in text
        await pilot.press("escape")
        assert not isinstance(app.screen, ResultsScreen)


@sync
async def test_results_in_the_recording_before_opening_are_not_toasted(live_app) -> None:
    # healthy_4replica holds a finished checkpoint: it is in the command line, not a toast.
    app = live_app(upto=300)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert "checkpoint done" in screen_text(app)
        assert not [n for n in app._notifications if "checkpoint" in n.message]


def test_short_paths() -> None:
    run = Path("/home/u/.tpuwatch/runs/r1")
    assert short_path("/home/u/.tpuwatch/runs/r1/checkpoints/ckpt-4", run, Path("/home/u")) == "checkpoints/ckpt-4"
    assert short_path("/home/u/ckpts/model", run, Path("/home/u")) == "~/ckpts/model"
    assert short_path("gs://bucket/ckpts/model", run, Path("/home/u")) == "gs://bucket/ckpts/model"
    assert short_path("/data/x", None, Path("/home/u")) == "/data/x"


def test_a_failure_says_why() -> None:
    c = CommandView(id="1", action="checkpoint", status="failed", message="no writable destination",
                    details={}, t=0.0)
    assert command_summary(c).plain == "checkpoint failed: no writable destination"

"""What a new user met at 80x24 (help, command results, the results list, l, an ended run, wording)."""

from __future__ import annotations

from ui_support import screen_text, sync

from tpuwatch.ui.screens.help_screen import HelpScreen


@sync
async def test_help_at_80x24_shows_every_description_whole_and_one_bottom_border(live_app) -> None:
    app = live_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = screen_text(app)
        assert "…" not in text.replace("1 … 8", "").replace("findings, …", "")
        words = " ".join(text.replace("│", " ").split())
        for whole in ("(a stalled or hung run)", "whole screen (it scrolls); again to restore",
                      "stacks) with full paths"):
            assert whole in words
        lines = text.splitlines()
        bottoms = [i for i, line in enumerate(lines) if line.startswith("╰")]
        assert not any(b + 1 in bottoms for b in bottoms), text

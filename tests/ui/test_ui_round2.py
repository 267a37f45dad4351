"""The dashboard in a user's hands, round 2 (issue 28, items 5-10 and "every key consistent")."""

from __future__ import annotations

import pytest
from ui_support import screen_text, sync

from tpuwatch.ui.widgets.panel import Panel

# --- item 5 and "every key consistent": each expanded panel closes the same way -----------------


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


# --- item 6: panel titles carry the number that jumps to them ------------------------------------


@sync
async def test_panel_titles_carry_their_number(live_app) -> None:
    from tpuwatch.ui.app import PANEL_IDS

    app = live_app(upto=300)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        for i, pid in enumerate(PANEL_IDS):
            widget = app.query_one(f"#{pid}")
            owner = widget if isinstance(widget, Panel) else widget.parent
            assert str(owner.border_title).startswith(f"{i + 1} "), (pid, owner.border_title)

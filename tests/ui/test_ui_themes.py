"""Focus and borders read in every theme and with NO_COLOR."""

from __future__ import annotations

import pytest
from textual.color import Color
from textual.theme import BUILTIN_THEMES
from ui_support import sync

from tpuwatch.protocol import Finding

#: Least perceived-brightness difference that reads as a line on its background.
MIN_CONTRAST = 0.12


def _on(bg: Color, c: Color) -> Color:
    return bg + c  # blends by c's alpha


@pytest.mark.parametrize("theme", sorted(BUILTIN_THEMES))
@sync
async def test_borders_focus_and_wait_chart_read_in_every_theme(live_app, theme) -> None:
    app = live_app(upto=200)
    async with app.run_test(size=(120, 40)) as pilot:
        app.theme = theme
        app._state.add_finding(Finding(t=app.snapshot.now, rule="replica-loss-skew", severity="warning",
                                       message="skew", advice="", evidence={"replica": 1}))
        app.pull()
        await pilot.pause()
        bg = app.screen.styles.background
        memory = app.query_one("#memory")  # calm and unfocused
        kind, colour = memory.styles.border_top
        assert kind == "round"
        wait = app.query_one("#wait-bars").styles.color
        if bg.ansi is not None:
            # ANSI themes draw with the terminal's own colours: the border must be its default
            # foreground (ansi -1), never ansi_black ($border-blurred there) on a black terminal.
            assert colour.ansi == -1 and wait.ansi is not None, (theme, colour, wait)
        else:
            assert abs(_on(bg, colour).brightness - bg.brightness) >= MIN_CONTRAST, (theme, colour, bg)
            assert abs(_on(bg, wait).brightness - bg.brightness) >= MIN_CONTRAST, (theme, wait, bg)
        loss = app.query_one("#loss")  # orange (a finding) ...
        assert loss.has_class("-warning") and loss.styles.border_top[0] == "round"
        await pilot.press("2")  # ... and focused: the line itself changes, not only its colour
        await pilot.pause()
        assert app.focused is loss and loss.styles.border_top[0] == "heavy"
        assert "reverse" in str(loss.styles.border_title_style)


@sync
async def test_focus_shows_without_colour(live_app, monkeypatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    app = live_app(upto=200)
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.no_color
        await pilot.press("1")
        await pilot.pause()
        from ui_support import screen_text

        top = next(line for line in screen_text(app).splitlines() if "Step time" in line)
        assert "┏" in top and "╭" in top  # the focused panel's heavy corner next to a round one

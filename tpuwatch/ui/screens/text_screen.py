"""A full-screen, scrollable view of one list from the snapshot (the results).

The text is a pure function of the snapshot (``render``); the app calls :meth:`TextScreen.show`
with each new snapshot while the screen is open, and the screen repaints only when the text
changed, keeping the reader's scroll position.
"""

from __future__ import annotations

from typing import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Footer, Static

from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.ui.printable_content import printable_content


class TextScreen(Screen[None]):
    """``title`` on the border; ``render(snapshot, width)`` gives the text."""

    # The keys that put an expanded panel back close this list too.
    BINDINGS = [Binding("escape,q,z,enter", "close", "Close", id="text.close")]

    def __init__(self, title: str, render: Callable[[RunSnapshot, int], Content], snapshot: RunSnapshot) -> None:
        super().__init__()
        self._title = title
        self._text_of = render
        self._snapshot = snapshot
        self._shown: tuple | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="text-view"):
            yield Static(id="text-body", markup=False)
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        view = self.query_one("#text-view")
        view.border_title = self._title
        view.border_subtitle = "esc, q or z closes · arrows, pgup/pgdn scroll"
        view.focus()
        self.show(self._snapshot)

    def on_resize(self) -> None:
        self._shown = None
        self.show(self._snapshot)

    def show(self, snapshot: RunSnapshot) -> None:
        self._snapshot = snapshot
        if not self.is_mounted:
            return
        content = self._text_of(snapshot, max(20, self.size.width - 4))
        key = (content.plain, tuple(content.spans))
        if key != self._shown:
            self._shown = key
            self.query_one("#text-body", Static).update(printable_content(content))

    def action_close(self) -> None:
        self.dismiss(None)

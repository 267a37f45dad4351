"""The output panel: the script's output log plus a search box opened with ``/``."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Input

from tpuwatch.ui.widgets.output_log import OutputLog


class OutputPanel(Vertical):
    """Not focusable itself: focus goes to the log (scrolling) or the search box."""

    TITLE = "8 Output"  # the number key that jumps here
    BINDINGS = [Binding("escape", "close_search", "Close search", id="output.close_search", show=False)]

    def compose(self) -> ComposeResult:
        yield OutputLog(id="output-log")
        yield Input(placeholder="search output (enter: find, esc: close)", id="output-search")

    def on_mount(self) -> None:
        self.border_title = self.TITLE
        search = self.query_one("#output-search", Input)
        search.display = False
        search.cursor_blink = False  # calm, and deterministic in snapshots

    @property
    def log_view(self) -> OutputLog:
        return self.query_one("#output-log", OutputLog)

    def append(self, lines: list[str]) -> None:
        self.log_view.append(lines)
        self.border_subtitle = self.log_view.match_status()

    def open_search(self) -> None:
        search = self.query_one("#output-search", Input)
        search.display = True
        search.focus()
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "close_search":
            # Nothing to close: esc goes on to the app (puts the maximised output back) and the
            # footer shows that instead.
            return self.query_one("#output-search", Input).display or bool(self.log_view.term)
        return True

    def action_close_search(self) -> None:
        search = self.query_one("#output-search", Input)
        if search.display:
            search.display = False
            self.log_view.focus()
        else:
            self.log_view.clear_search()
            self.border_subtitle = ""
        self.refresh_bindings()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        term = event.value.strip()
        search = self.query_one("#output-search", Input)
        search.display = False
        if term:
            self.log_view.search(term)
        else:
            self.log_view.clear_search()
        self.border_subtitle = self.log_view.match_status()
        self.log_view.focus()
        self.refresh_bindings()

    def on_output_log_search_changed(self, event: OutputLog.SearchChanged) -> None:
        self.border_subtitle = self.log_view.match_status()

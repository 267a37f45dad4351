"""The output panel: the script's output log plus a search box opened with ``/``."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Input

from tpuwatch.ui.widgets.output_log import OutputLog


class OutputPanel(Vertical):
    """Not focusable itself: focus goes to the log (scrolling) or the search box."""

    TITLE = "8 Output"  # the number key that jumps here
    BINDINGS = [Binding("escape", "close_search", "Close search", id="output.close_search", show=False)]

    def __init__(self, *, id: str | None = None, arrows_scroll: bool = True) -> None:
        super().__init__(id=id)
        self._cut_hint = "lines cut: ←/→ scroll (8 or o first)" if arrows_scroll else "lines cut: whole in output.log"

    def compose(self) -> ComposeResult:
        yield OutputLog(id="output-log")
        yield Input(placeholder="search output (enter: find, esc: close)", id="output-search")

    def on_mount(self) -> None:
        self.border_title = self.TITLE
        search = self.query_one("#output-search", Input)
        search.display = False
        search.cursor_blink = False  # calm, and deterministic in snapshots
        self.watch(self.log_view, "virtual_size", self._show_status, init=False)

    @property
    def log_view(self) -> OutputLog:
        return self.query_one("#output-log", OutputLog)

    def append(self, lines: list[str]) -> None:
        self.log_view.append(lines)
        self._show_status()

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
            self._show_status()
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
        self._show_status()
        self.log_view.focus()
        self.refresh_bindings()

    def on_output_log_search_changed(self, event: OutputLog.SearchChanged) -> None:
        self._show_status()

    def on_resize(self) -> None:
        self._show_status()

    def _show_status(self, *_: object) -> None:
        """The border's subtitle: the search's matches, else that lines are wider than the view
        (the log has no horizontal scrollbar: it would cost a row of a five-row panel)."""
        status = self.log_view.match_status()
        log = self.log_view
        if not status.plain and log.virtual_size.width > log.scrollable_content_region.width > 0:
            status = Content(self._cut_hint)
        if log.unseen:  # held on a match or scrolled up while the run goes on writing
            news = f"{log.unseen:,} new line{'s' if log.unseen != 1 else ''} below"
            status = Content(f"{status.plain} · {news}" if status.plain else news)
        self.border_subtitle = status

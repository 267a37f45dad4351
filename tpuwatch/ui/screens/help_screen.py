"""The key reference (``?``), built from the app's live bindings so remapped keys show."""

from __future__ import annotations

from typing import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


def help_text(rows: Sequence[tuple[str, str, bool]]) -> Group:
    """``rows``: (keys, what it does, available now). A grid, so a long description wraps under
    itself at 80 columns instead of ending in an ellipsis."""
    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    for keys, description, enabled in rows:
        table.add_row(Text(keys, style="bold" if enabled else "dim"),
                      Text.assemble((description, "" if enabled else "dim"),
                                    ("  (off now)" if not enabled else "", "dim")))
    return Group(table, Text(""), Text("Also: ctrl+p command palette · esc or ? closes this help", style="dim"))


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close", id="help.close")]

    def __init__(self, rows: Sequence[tuple[str, str, bool]]) -> None:
        super().__init__()
        self._rows = list(rows)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-dialog"):
            yield Static(help_text(self._rows), id="help-text")

    def on_mount(self) -> None:
        dialog = self.query_one("#help-dialog")
        dialog.border_title = "Help"
        # On the border, not only at the end: at 80x24 the end is below the fold and the dialog
        # covers the footer.
        dialog.border_subtitle = "esc or ? closes · arrows scroll"

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(None)

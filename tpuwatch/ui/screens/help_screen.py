"""The key reference (``?``), built from the app's live bindings so remapped keys show."""

from __future__ import annotations

from typing import Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static


def help_text(rows: Sequence[tuple[str, str, bool]]) -> Content:
    """``rows``: (keys, what it does, available now)."""
    width = max((len(k) for k, _, _ in rows), default=4) + 2
    lines = [Content.styled("Keys", "bold"), Content("")]
    for keys, description, enabled in rows:
        lines.append(Content.assemble(
            (keys.ljust(width), "bold" if enabled else "dim"),
            (description, "" if enabled else "dim"),
            ("  (off now)" if not enabled else "", "dim"),
        ))
    lines += [Content(""), Content.styled("Also: ctrl+p command palette · esc or ? closes this help", "dim")]
    return Content("\n").join(lines)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close", id="help.close")]

    def __init__(self, rows: Sequence[tuple[str, str, bool]]) -> None:
        super().__init__()
        self._rows = list(rows)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-dialog"):
            yield Static(help_text(self._rows), id="help-text")

    def on_mount(self) -> None:
        self.query_one("#help-dialog").border_title = "Help"

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(None)

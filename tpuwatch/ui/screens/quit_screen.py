"""Asked when quitting while training runs: stop it, leave it running, or stay."""

from __future__ import annotations

from typing import Literal

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label

QuitChoice = Literal["stop", "detach"]


class QuitScreen(ModalScreen["QuitChoice | None"]):
    """Dismisses with ``"stop"``, ``"detach"`` or ``None`` (cancel). Cancel has the focus, so
    an absent-minded enter never stops a training run."""

    BINDINGS = [
        Binding("s", "choose('stop')", "Stop training", id="quit.stop"),
        Binding("d", "choose('detach')", "Detach", id="quit.detach"),
        Binding("escape,c", "choose('cancel')", "Cancel", id="quit.cancel"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(id="quit-dialog"):
            yield Label("Training is still running.", id="quit-title")
            yield Label(
                "Stop it (SIGINT; SIGTERM after 15 s; SIGKILL 10 s later), or detach and leave it "
                "running? Re-attach later with `tpuwatch attach`.",
                id="quit-text",
            )
            with Horizontal(id="quit-buttons"):
                yield Button("Stop training (s)", id="stop", variant="error")
                yield Button("Detach (d)", id="detach", variant="primary")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_choose(event.button.id or "cancel")

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice if choice in ("stop", "detach") else None)  # type: ignore[arg-type]

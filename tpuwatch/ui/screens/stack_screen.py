"""The stacks of the training process (key ``s``): for a run that stalls or hangs.

Follows a :class:`~tpuwatch.control.stack_request.StackRequest` at a few Hz until it has the
dump (from the agent's ``stack_dump`` command, or from faulthandler after SIGUSR1 when the agent
cannot answer) and shows it, the training thread first. While a stall goes on and the agent took
its stacks by itself when it began (:func:`stall_stacks`), ``s`` shows those at once.
"""

from __future__ import annotations

from typing import Callable, Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, TextArea

from tpuwatch.control.stack_request import StackRequest, StackView
from tpuwatch.monitor.snapshot import CommandView, RunSnapshot
from tpuwatch.printable import one_line, printable
from tpuwatch.protocol import StackDump

POLL_HZ = 4.0


def innermost_training_frame_row(text: str) -> int | None:
    """The row of the training thread's innermost source line in a ``stack_dump`` text (the
    agent lists that thread first, outermost frame first, ending with a blank line)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "[TRAINING THREAD" in line), None)
    if start is None:
        return None
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), len(lines))
    return end - 1 if end - 1 > start else None


def stall_stacks(s: RunSnapshot, dumps: Sequence[StackDump]) -> StackDump | None:
    """The stacks the agent took by itself when the stall going on began (the ``stall`` finding's
    evidence names them); None when no stall goes on, or its stacks did not arrive."""
    for f in s.findings:
        path = f.evidence.get("stacks")
        if f.rule == "stall" and f.evidence.get("ongoing") == 1 and path:
            return next((d for d in reversed(dumps) if d.path == path), None)
    return None


class StackScreen(ModalScreen[None]):
    """``lookup`` returns the current commands and stack dumps (from the dashboard's state)."""

    DEFAULT_CSS = """
    StackScreen { align: center middle; }
    StackScreen > #stack-dialog {
        width: 95%; height: 90%; border: round $primary; background: $surface; padding: 0 1;
    }
    StackScreen #stack-note { width: 1fr; color: $text-muted; }
    StackScreen #stack-note.-failed { color: $error; }
    StackScreen #stack-text { height: 1fr; }
    """
    # Priority: the text area has the focus and would take escape and letters itself.
    BINDINGS = [Binding("escape,q,s", "close", "Close", id="stacks.close", priority=True)]

    def __init__(
        self,
        request: StackRequest,
        lookup: Callable[[], tuple[Sequence[CommandView], Sequence[StackDump]]],
    ) -> None:
        super().__init__()
        self.request = request
        self._lookup = lookup
        self._shown: StackView | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="stack-dialog"):
            yield Label("Stacks of the training process", id="stack-title")
            yield Label("", id="stack-note", markup=False)  # the agent's message and paths, as they are
            yield TextArea("", id="stack-text", read_only=True, show_line_numbers=False, soft_wrap=False)

    def on_mount(self) -> None:
        self.poll()
        self.set_interval(1.0 / POLL_HZ, self.poll, name="stack-poll")

    def poll(self) -> None:
        commands, dumps = self._lookup()
        view = self.request.update(commands, dumps)
        if view == self._shown:
            return
        self._shown = view
        note = self.query_one("#stack-note", Label)
        note.update(one_line(view.note) + ("" if view.status != "done" else "  (esc to close)"))
        note.set_class(view.status == "failed", "-failed")
        if view.text:
            area = self.query_one("#stack-text", TextArea)
            area.load_text(printable(view.text))
            row = innermost_training_frame_row(view.text)
            if row is not None:  # where it hangs is what the user came for: centre it once laid out
                self.call_after_refresh(area.move_cursor, (row, 0), center=True)
            area.focus()

    def action_close(self) -> None:
        self.dismiss(None)

"""The summary of a finished profile capture, shown in a modal when its Result arrives.

The summary itself is computed by :mod:`tpuwatch.monitor.profile_summary` (xprof, no TensorFlow)
in a worker thread (0.01-0.3 s): :func:`load_summary_text` is what that worker runs, and
:func:`new_profile_results` tells the app which profile results it has not shown yet.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tpuwatch.monitor.diagnostics.input_share import InputShare
from tpuwatch.monitor.snapshot import CommandView, RunSnapshot
from tpuwatch.printable import printable


def new_profile_results(snapshot: RunSnapshot, seen: set[str], ids: Iterable[str] | None = None) -> list[CommandView]:
    """Profile commands that finished ok and are not in ``seen`` (which is updated).

    ``ids``: only these command ids (the ones this dashboard sent), or every one when None.
    """
    wanted = None if ids is None else set(ids)
    out = []
    for c in snapshot.commands:
        if c.action != "profile" or c.status != "done" or c.id in seen:
            continue
        if wanted is not None and c.id not in wanted:
            continue
        seen.add(c.id)
        out.append(c)
    return out


def load_summary_text(command: CommandView, live: InputShare | None = None, width: int = 100) -> str:
    """The text for the modal (runs in a worker thread: xprof takes up to ~0.3 s). ``live``:
    the run's own input-wait measurement, shown beside the profile's; ``width``: the columns of
    a line in the dialog."""
    from tpuwatch.monitor import profile_summary

    d = command.details
    local = d.get("local_path") or d.get("path")
    raw_logdir = d.get("logdir")
    logdir: str | None = raw_logdir if isinstance(raw_logdir, str) else None
    if not isinstance(local, str) or not os.path.isdir(local):
        where = f" ({local})" if isinstance(local, str) else ""
        lines = [f"The capture is not on this machine{where}; open it where it is:"]
        if logdir:
            lines += [f"  {c}" for c in profile_summary.open_commands(str(logdir))]
        return "\n".join(lines)
    try:
        return profile_summary.render_text(profile_summary.summarize(local), width=width, live=live)
    except profile_summary.ProfileSummaryError as e:
        # The capture is still there: say how to open it, as `tpuwatch profile` does.
        parents = Path(local).parents  # <logdir>/plugins/profile/<capture>
        open_dir = logdir if logdir and not logdir.startswith("gs://") else str(parents[min(2, len(parents) - 1)])
        return "\n".join([f"No summary: {e}", "Open it with:",
                          *(f"  {c}" for c in profile_summary.open_commands(open_dir))])


class ProfileSummaryScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,enter", "dismiss", "Close", id="profile-summary.close")]
    DEFAULT_CSS = """
    ProfileSummaryScreen { align: center middle; }
    #profile-summary-dialog {
        width: 90%; max-width: 120; height: auto; max-height: 90%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    """

    def __init__(self, text: str) -> None:
        super().__init__()
        self._text = text

    @staticmethod
    def text_width(screen_width: int) -> int:
        """Columns a line of the summary has in the dialog on a screen ``screen_width`` wide (90 %
        of it, at most 120, less the border and the padding)."""
        return max(20, min(120, screen_width * 9 // 10) - 4)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="profile-summary-dialog"):
            yield Static(printable(self._text), id="profile-summary-text", markup=False)

    def on_mount(self) -> None:
        dialog = self.query_one("#profile-summary-dialog")
        dialog.border_title = "Profile"
        dialog.border_subtitle = "esc closes"

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(None)

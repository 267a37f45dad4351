"""Every command of the run (profiles, checkpoints, stack dumps) with its whole result (``r``)."""

from __future__ import annotations

from textual.content import Content

from tpuwatch import units
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.ui.screens.text_screen import TextScreen
from tpuwatch.ui.widgets.command_line import _STYLE, _WORDS, result_path


def results_text(s: RunSnapshot, width: int) -> Content:
    """Newest first: when (run time), what, its state, the agent's message and the full path
    (once: the agent's message usually names it already)."""
    if not s.commands:
        return Content.styled("No commands yet: p profiles, c checkpoints, s shows the stacks.", "dim")
    lines: list[Content] = []
    for c in reversed(s.commands):
        when = units.clock(c.t - s.started_t) if s.started_t is not None else ""
        step = c.details.get("step")
        head = Content.assemble(
            (f"{when:>8}  ", "dim"), (f"{c.action:<11}", "bold"),
            (f"{_WORDS.get(c.status, c.status):<9}", _STYLE.get(c.status, "")),
            (f" step {step}" if isinstance(step, int) else "", "dim"),
        )
        lines.append(head)
        if c.message:
            lines.append(Content.assemble("          ", c.message))
        path = result_path(c)
        if path and path not in c.message:  # the whole path once, to copy; no short form again
            lines.append(Content.assemble(("          path ", "dim"), path))
        lines.append(Content(""))
    return Content("\n").join(lines)


class ResultsScreen(TextScreen):
    def __init__(self, snapshot: RunSnapshot) -> None:
        super().__init__("Command results", results_text, snapshot)

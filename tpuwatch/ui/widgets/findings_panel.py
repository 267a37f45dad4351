"""Findings from the diagnostics rules (and the crash, if there was one), worst first."""

from __future__ import annotations

from textual.content import Content

from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.protocol import SEVERITY_RANK
from tpuwatch.ui.widgets.panel import Panel

_MARK = {"critical": ("!!", "$error bold"), "warning": ("! ", "$warning bold"), "info": ("i ", "$primary")}


def findings_text(s: RunSnapshot, rows: int, width: int = 10_000) -> Content:
    """Worst first, each with its advice. Lines wrap at ``width``; what does not fit ``rows``
    ends in a "more" line (Enter or z expands the panel, which then scrolls)."""
    lines: list[Content] = []
    if s.status == "lost":
        lines.append(Content.assemble(("!! ", "$warning bold"), ("lost contact: ", "$warning bold"),
                                      s.lost_reason or "no exit record from the training process"))
    if s.exception:
        lines.append(Content.assemble(("!! ", "$error bold"), ("crashed: ", "$error bold"), s.exception))
    findings = sorted(s.findings, key=lambda f: (-SEVERITY_RANK.get(f.severity, -1), -f.t))
    for f in findings:
        mark, style = _MARK.get(f.severity, ("  ", ""))
        lines.append(Content.assemble((mark + " ", style), f.message))
        if f.advice:
            lines.append(Content.styled("   " + f.advice, "dim"))
    for probe, reason in sorted(s.disabled_probes.items()):
        lines.append(Content.styled(f"-  probe {probe} off: {reason}", "dim"))
    if not lines:
        return Content.styled("No findings", "dim")
    heights = [max(1, -(-line.cell_length // max(1, width))) for line in lines]
    if sum(heights) > rows:
        kept, used = [], 0
        for line, h in zip(lines, heights):
            if used + h > rows - 1:
                break
            kept.append(line)
            used += h
        more = len(lines) - len(kept)
        lines = kept + [Content.styled(f"… {more} more: z expands", "$text-muted italic")]
    return Content("\n").join(lines)


class FindingsPanel(Panel):
    TITLE = "Findings"

    def body(self, snapshot: RunSnapshot, rows: int, width: int) -> Content:
        return findings_text(snapshot, rows, width)

    def state(self, snapshot: RunSnapshot) -> str | None:
        severities = {f.severity for f in snapshot.findings}
        if snapshot.exception or "critical" in severities:
            return "-critical"
        if snapshot.status == "lost" or "warning" in severities:
            return "-warning"
        return None

"""Findings from the diagnostics rules (and the crash, if there was one), worst first."""

from __future__ import annotations

from textual.content import Content

from tpuwatch import units
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.protocol import SEVERITY_RANK
from tpuwatch.ui.widgets.panel import Panel

_MARK = {"critical": ("!!", "$error bold"), "warning": ("! ", "$warning bold"), "info": ("i ", "$primary")}


def findings_text(s: RunSnapshot, rows: int, width: int = 10_000) -> Content:
    """Worst first, each headline with its advice; a crash's diagnosis before the raw error.

    Lines wrap at ``width``. When everything does not fit ``rows``, the headlines come first
    (the worst one always, cut to the rows there are) and the advice of the shown findings takes
    the rows left; when headlines are left out too, a last line counts them (Enter or z expands
    the panel, which then scrolls)."""
    items = _items(s)
    if not items:
        return Content.styled("No findings", "dim")
    width = max(2, width)

    def height(c: Content) -> int:
        return max(1, len(c.wrap(width)))

    if sum(height(head) + (height(more) if more else 0) for _, head, more in items) <= rows:
        return Content("\n").join(c for _, head, more in items for c in (head, more) if c)
    if rows <= 1:
        return _cut(items[0][1], 1, width)
    # every headline fits: no count line (a cut advice ends in "…"); else the last row counts
    avail = rows if sum(height(head) for _, head, _ in items) <= rows else rows - 1
    shown: list[list] = []  # [headline, rows, detail, rows]
    used = 0
    for _, head, more in items:
        h = height(head)
        if shown and used + h > avail:
            break
        h = min(h, avail)
        shown.append([head, h, more, 0])
        used += h
    for entry in shown:
        if entry[2] and used < avail:
            entry[3] = min(height(entry[2]), avail - used)
            used += entry[3]
    lines = []
    for head, h, more, mh in shown:
        lines.append(_cut(head, h, width))
        if mh:
            lines.append(_cut(more, mh, width))
    left = len(items) - len(shown)
    if left:
        lines.append(Content.styled(f"… {left} more: z expands", "$text-muted italic"))
    return Content("\n").join(lines)


def _items(s: RunSnapshot) -> list[tuple[tuple[float, float], Content, Content | None]]:
    """(rank, headline, detail) worst first. A crash's raw error ranks after the critical
    findings: the ``script-crash`` diagnosis says what to change, the raw error only what TF said."""
    items: list[tuple[tuple[float, float], Content, Content | None]] = []  # (rank, -t)
    for f in s.findings:
        mark, style = _MARK.get(f.severity, ("  ", ""))
        hint = "  (s: the stacks taken when it stalled)" if (
            f.rule == "stall" and f.evidence.get("ongoing") == 1 and f.evidence.get("stacks")) else ""
        advice = Content.styled("   " + f.advice + hint, "dim") if f.advice else None
        # critical 0, warning 1, info 2 (unknown severities 3): lower ranks first
        rank = 2 - SEVERITY_RANK[f.severity] if f.severity in SEVERITY_RANK else 3
        items.append(((rank, -f.t), Content.assemble((mark + " ", style), f.message), advice))
    if s.exception:
        first, _, rest = s.exception.partition("\n")
        items.append(((0.5, 0.0), Content.assemble(("!! ", "$error bold"), ("crashed: ", "$error bold"), first),
                      Content(rest.strip("\n")) if rest.strip() else None))
    if s.status == "stalled" and not any(f.rule == "stall" and f.evidence.get("ongoing") for f in s.findings):
        # Stalled without the stall rule's finding: the process sent nothing at all, samples included.
        quiet = units.clock(s.now - s.last_message_t) if s.last_message_t is not None else units.UNKNOWN
        items.append(((0.6, 0.0), Content.assemble(
            ("!! ", "$warning bold"), ("silent: ", "$warning bold"),
            f"nothing from the training process for {quiet}, not even the agent's samples"),
            Content.styled("   It is stopped or frozen (a C call holding the GIL), or its recording "
                           "does not arrive: a stack dump (s) tells which", "dim")))
    if s.status == "lost":
        items.append(((0.6, 0.0), Content.assemble(("!! ", "$warning bold"), ("lost contact: ", "$warning bold"),
                                            s.lost_reason or "no exit record from the training process"), None))
    for probe, reason in sorted(s.disabled_probes.items()):
        items.append(((4.0, 0.0), Content.styled(f"-  probe {probe} off: {reason}", "dim"), None))
    items.sort(key=lambda item: item[0])
    return items


def _cut(c: Content, rows: int, width: int) -> Content:
    """``c`` in at most ``rows`` rows of ``width`` cells; the last row filled and ending in "…"
    when cut (word wrapping would leave it half empty)."""
    lines = c.wrap(width)
    if len(lines) <= rows:
        return c
    pos = 0
    for line in lines[: rows - 1]:
        pos = c.plain.index(line.plain, pos) + len(line.plain)
    rest = c[pos:]
    rest = rest[len(rest.plain) - len(rest.plain.lstrip()):]
    return Content("\n").join([*lines[: rows - 1], Content.assemble(rest.truncate(width - 1), "…")])


class FindingsPanel(Panel):
    TITLE = "4 Findings"  # the number key that jumps here

    def body(self, snapshot: RunSnapshot, rows: int, width: int) -> Content:
        return findings_text(snapshot, rows, width)

    def state(self, snapshot: RunSnapshot) -> str | None:
        severities = {f.severity for f in snapshot.findings}
        if snapshot.exception or "critical" in severities:
            return "-critical"
        if snapshot.status == "lost" or "warning" in severities:
            return "-warning"
        return None

"""Dashboard text with the run's control characters shown escaped (see :mod:`tpuwatch.printable`).

Textual writes a widget's text to the terminal as it is (it drops BEL and a few others, not ESC
nor the C1 controls), so a script name, an exception message or a finding quoting one could
reset the viewer's terminal or write its clipboard. Every panel body, the header, the command
lines, the text screens and the toasts go through :func:`printable_content` (or
:func:`~tpuwatch.printable.printable` for plain strings) on their way to the screen.
"""

from __future__ import annotations

from textual.content import Content, Span

from tpuwatch.printable import printable

#: What a dashboard line keeps: newlines lay out a body; a tab would not line up in a panel.
KEEP = "\n"


def printable_content(content: Content) -> Content:
    """``content`` with each control character escaped, its styles moved along with the text.
    The same object when there is none (the common case: one scan of the text)."""
    plain = content.plain
    if printable(plain, KEEP) == plain:
        return content
    starts = []  # where each original character starts in the new text
    pieces = []
    at = 0
    for char in plain:
        starts.append(at)
        piece = printable(char, KEEP)
        pieces.append(piece)
        at += len(piece)
    starts.append(at)
    end = len(plain)
    spans = [Span(starts[min(s.start, end)], starts[min(s.end, end)], s.style) for s in content.spans]
    return Content("".join(pieces), spans)

"""How text from the run is shown in a terminal: control characters visibly escaped.

Everything a run writes can reach the viewer's terminal: script names, run ids, exception
messages, findings that quote them, command results, the script's output. A terminal obeys what
it is sent, so a string holding ``ESC c`` resets it, OSC 52 (``ESC ] 52 ;``) writes the viewer's
clipboard, OSC 0 sets the window or tmux pane title, ``ESC 7``/``ESC 8`` move the cursor, and the
8-bit C1 forms (``\\x9b`` CSI, ``\\x9d`` OSC) do the same in one byte. :func:`printable` is the
one function every path from the run to a terminal goes through (the dashboard, the headless
lines, ``report``, ``attach``, ``ls``): each such character is shown as its Python escape
(``\\x1b``), so the text stays readable and nothing is executed. Lone surrogates (a file name
decoded with ``surrogateescape``) are escaped too: a UTF-8 terminal stream cannot encode them.

What is not escaped: printable characters, and the layout characters named in ``keep``
(newline and tab by default; a table cell keeps neither). Standard library only: every part but
the agent imports this.
"""

from __future__ import annotations

import re

_PATTERNS: dict[str, re.Pattern[str]] = {}


def _pattern(keep: str) -> re.Pattern[str]:
    """C0 controls but ``keep``, DEL, C1 controls and lone surrogates: one character class (a
    look-ahead for ``keep`` made the search 5 times slower)."""
    pattern = _PATTERNS.get(keep)
    if pattern is None:
        c0 = "".join(re.escape(chr(c)) for c in range(0x20) if chr(c) not in keep)
        pattern = re.compile(f"[{c0}\x7f-\x9f\ud800-\udfff]")
        _PATTERNS[keep] = pattern
    return pattern


_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, keep: str = "\n\t") -> str:
    """``text`` with every control character except those in ``keep`` shown as an escape:
    ``"a\\x1bcb"`` becomes ``"a\\\\x1bcb"`` (the four characters ``\\x1b``). Text without any
    is returned as it is (the common case costs a ``str.isprintable``)."""
    probe = text
    for char in keep:
        if char in probe:
            probe = probe.replace(char, "")
    if probe.isprintable():  # the common case, in C: nothing to escape
        return text
    return _pattern(keep).sub(_escape, text)  # (other non-printables, e.g. a no-break space, stay)


def one_line(text: str) -> str:
    """``text`` for a single line (a table cell, a name in a header): newlines and tabs escaped too."""
    return printable(text, keep="")

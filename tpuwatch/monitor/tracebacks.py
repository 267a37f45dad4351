"""Tracebacks as the user should read them: without tpuwatch's own frames, with the script's line.

The agent runs the script through ``runpy`` and wraps TensorFlow calls, so a raw traceback (and
TensorFlow's "Detected at node ... defined at" stacks inside an error message) carries frames of
``<frozen runpy>`` and ``tpuwatch/agent/...`` that say nothing about the user's code. Every view
that shows a traceback (``tpuwatch report``, the dashboard's crash line, the ``script-crash``
finding) passes it through :func:`strip_own_frames`, which says how many frames it left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FRAME = re.compile(r'^(\s*)File "([^"]+)", line (\d+), in (\S+)')
#: Frames of these files are tpuwatch's own plumbing (the agent's runner and its patches).
_OWN = ("<frozen runpy>", "/tpuwatch/agent/", "\\tpuwatch\\agent\\", "tpuwatch/agent/")
#: Frames of these are libraries or the runtime, not the user's script.
_NOT_USER = ("site-packages", "dist-packages", "<frozen", "<string>", "/lib/python3",
             "\\lib\\python3", "/tpuwatch/agent/", "/tpuwatch/monitor/")


@dataclass(frozen=True)
class ScriptFrame:
    """The deepest frame of the user's own code in a traceback."""

    path: str
    line: int
    function: str
    code: str  # the source line when the traceback has it, else ""

    def __str__(self) -> str:
        where = f"{self.path}:{self.line} in {self.function}"
        return f"{where}: {self.code}" if self.code else where


def _is_own(path: str) -> bool:
    return any(m in path for m in _OWN)


def strip_own_frames(text: str) -> tuple[str, int]:
    """``text`` without tpuwatch's own frames (each frame's ``File`` line and the indented
    source lines under it); returns the text and the number of frames left out."""
    if "File \"" not in text:
        return text, 0
    out: list[str] = []
    dropped = 0
    skip_indent: int | None = None  # inside a dropped frame: lines indented deeper belong to it
    for line in text.split("\n"):
        m = _FRAME.match(line)
        if m:
            skip_indent = None
            if _is_own(m.group(2)):
                dropped += 1
                skip_indent = len(m.group(1))
                continue
        elif skip_indent is not None:
            stripped = line.strip()
            indent = len(line) - len(line.lstrip())
            if stripped and indent > skip_indent:
                continue  # the dropped frame's source line and its ^^^^ markers
            if not stripped:
                continue  # TF's stacks put a blank line after each frame
            skip_indent = None
        out.append(line)
    return "\n".join(out), dropped


def without_own_frames(text: str) -> str:
    """:func:`strip_own_frames` with a note that says what was left out."""
    stripped, n = strip_own_frames(text)
    if not n:
        return text
    return (f"{stripped.rstrip()}\n(tpuwatch left out {n} frame{'s' if n != 1 else ''} of its own: "
            "<frozen runpy> and tpuwatch/agent)")


def script_frame(text: str) -> ScriptFrame | None:
    """The last frame of user code in ``text`` (a traceback, or an error message with TF's
    "in user code" / "defined at" stacks): not a library, not tpuwatch, not the runtime."""
    best: ScriptFrame | None = None
    codes: dict[tuple[str, int], str] = {}  # TF's "defined at" stacks repeat frames without code
    lines = text.split("\n")
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if not m:
            continue
        path = m.group(2)
        if any(mark in path for mark in _NOT_USER):
            continue
        code = ""
        if i + 1 < len(lines):
            nxt = lines[i + 1]
            if nxt.strip() and not _FRAME.match(nxt) and len(nxt) - len(nxt.lstrip()) > len(m.group(1)):
                code = nxt.strip()
        key = (path, int(m.group(3)))
        if code:
            codes[key] = code
        best = ScriptFrame(path, key[1], m.group(4), codes.get(key, ""))
    return best

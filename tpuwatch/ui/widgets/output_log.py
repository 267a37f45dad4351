"""The script's output (output.log): a scrollable log view with search highlighting."""

from __future__ import annotations

import re

from rich.highlighter import Highlighter
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.content import Content
from textual.message import Message
from textual.widgets import Log

#: Lines kept in memory; older ones scroll away (output.log on disk keeps everything).
MAX_LINES = 20_000

#: TensorFlow's (absl/glog) C++ log lines: ``I0000 00:00:1750000001.1 12 cudart_stub.cc:29] ...``
#: and the older ``2025-06-15 12:00:01.123456: I tensorflow/core/...cc:42] ...``. They fill the top
#: of every run's output; shown dimmed, and folded away with ``f``.
NATIVE_LOG = re.compile(r"^(?:[IWEF]\d{4} \d\d:\d\d:[\d.]+\s+\d+ |\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] )\S+:\d+\]")


def is_native_log(line: str) -> bool:
    return NATIVE_LOG.match(line) is not None


class _TermHighlighter(Highlighter):
    def __init__(self) -> None:
        self.term = ""
        self.style: Style | None = None
        self.native_style: Style | None = None

    def highlight(self, text: Text) -> None:
        if self.native_style is not None and is_native_log(text.plain):
            text.stylize(self.native_style)
        if not self.term or self.style is None:
            return
        plain = text.plain.lower()
        start = plain.find(self.term)
        while start >= 0:
            text.stylize(self.style, start, start + len(self.term))
            start = plain.find(self.term, start + len(self.term))


class OutputLog(Log):
    """A :class:`textual.widgets.Log` that follows new output only while scrolled to the end,
    and highlights a search term (case-insensitive) with the ``output-log--match`` style."""

    COMPONENT_CLASSES = {"output-log--match", "output-log--native"}
    DEFAULT_CSS = """
    OutputLog > .output-log--match { text-style: reverse bold; }
    OutputLog > .output-log--native { text-style: dim; color: $text-muted; }
    """
    BINDINGS = [
        Binding("n", "next_match", "Next match", id="output.next_match", show=False),
        Binding("N", "previous_match", "Previous match", id="output.previous_match", show=False),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(highlight=True, max_lines=MAX_LINES, auto_scroll=True, **kwargs)
        self.highlighter: _TermHighlighter = _TermHighlighter()
        self.term = ""
        self.matches: list[int] = []
        self.current: int | None = None  # index into matches
        self._follow = True  # keep the newest line in view (until the user scrolls up)
        self.fold_native = False  # hide TensorFlow's C++ log lines
        self._all: list[str] = []  # every line, folded or not (to unfold), bounded like the log
        self.folded = 0  # native lines hidden now
        self.unseen = 0  # lines written below the view since it stopped following (a match, a scroll up)

    def on_mount(self) -> None:
        self.highlighter.native_style = self.get_component_rich_style("output-log--native")

    def append(self, lines: list[str]) -> None:
        if not lines:
            return
        self._all.extend(lines)
        if len(self._all) > MAX_LINES:
            del self._all[: len(self._all) - MAX_LINES]
        if self.fold_native:
            shown = [line for line in lines if not is_native_log(line)]
            self.folded += len(lines) - len(shown)
            lines = shown
            if not lines:
                return
        # Follow only while the newest line is in view: reading older output is not
        # interrupted by new lines. Before the first layout there is no size to judge by.
        if self.size.height:
            self._follow = self.is_vertical_scroll_end or self.max_scroll_y == 0
        self.unseen = 0 if self._follow else self.unseen + len(lines)
        full = self.line_count + len(lines) > MAX_LINES
        self.write_lines(lines, scroll_end=self._follow)
        if full:
            # Log repaints the new lines' indices counted before it dropped the oldest, i.e.
            # below its end, and a view already at the end does not scroll: without this the
            # panel kept showing line 20,000 of a run at 10k lines/s until a resize.
            self.refresh()
        if self.term:
            self._find_matches()

    def set_fold(self, fold: bool) -> None:
        """Hides (or shows again) TensorFlow's C++ log lines, keeping everything else."""
        self.fold_native = fold
        lines = [line for line in self._all if not (fold and is_native_log(line))]
        self.folded = len(self._all) - len(lines)
        super().clear()  # the view only: every line stays in self._all
        self.write_lines(lines, scroll_end=self._follow)
        if self.term:
            self._find_matches()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self.unseen and self.is_vertical_scroll_end:
            self.unseen = 0  # the new lines are in view: no longer news
            self.post_message(self.SearchChanged())

    def clear(self):  # type: ignore[override]
        """Forgets every line (a replay seeking back starts over)."""
        self._all = []
        self.folded = 0
        self.unseen = 0
        return super().clear()

    def on_resize(self) -> None:
        if self._follow:
            self.scroll_end(animate=False, immediate=True)

    def search(self, term: str) -> int:
        """Highlights ``term`` and jumps to its last occurrence above the bottom of the view.
        Returns the number of matching lines."""
        self.term = term.lower()
        self.highlighter.term = self.term
        self.highlighter.style = self.get_component_rich_style("output-log--match")
        self._find_matches()
        bottom = self.scroll_offset.y + self.size.height
        before = [i for i, y in enumerate(self.matches) if y < bottom]
        self.current = before[-1] if before else (0 if self.matches else None)
        self._show_current()
        return len(self.matches)

    def clear_search(self) -> None:
        self.term = ""
        self.highlighter.term = ""
        self.matches = []
        self.current = None
        self._render_line_cache.clear()
        self.refresh()

    def action_next_match(self) -> None:
        if self.matches:
            self.current = 0 if self.current is None else (self.current + 1) % len(self.matches)
            self._show_current()

    def action_previous_match(self) -> None:
        if self.matches:
            self.current = len(self.matches) - 1 if self.current is None else (self.current - 1) % len(self.matches)
            self._show_current()

    def match_status(self) -> Content:
        """The panel's border subtitle: plain text (a term like ``[/]`` is no markup)."""
        if not self.term:
            return Content("")
        if not self.matches:
            return Content(f"/{self.term}: no match")
        pos = (self.current or 0) + 1
        return Content(f"/{self.term}: {pos}/{len(self.matches)} (n/N)")

    def _find_matches(self) -> None:
        term = self.term
        self.matches = [y for y, line in enumerate(self.lines) if term in line.lower()]
        if self.current is not None and self.current >= len(self.matches):
            self.current = len(self.matches) - 1 if self.matches else None
        self._render_line_cache.clear()
        self.refresh()

    def _show_current(self) -> None:
        self._render_line_cache.clear()
        if self.current is not None:
            self._follow = False  # stay on the match while new output arrives
            y = self.matches[self.current]
            self.scroll_to(y=max(0, y - self.size.height // 2), animate=False, immediate=True)
        self.refresh()
        self.post_message(self.SearchChanged())

    class SearchChanged(Message):
        """The search term or the current match changed (the panel updates its subtitle)."""

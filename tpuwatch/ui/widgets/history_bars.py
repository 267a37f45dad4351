"""A bar-chart history plot: one column per time bucket, newest on the right.

Drawn with the eight block glyphs every terminal font has (no braille), so it reads the same
over SSH, in 16 colours and with NO_COLOR. The scale is fixed by the caller (``lo``/``hi``):
step time starts at zero so noise does not look like a cliff; a share runs 0..1.

Cost per refresh is O(points + width × height): the history in a snapshot is bounded and
already downsampled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

from textual.content import Content
from textual.geometry import Region
from textual.reactive import reactive
from textual.widget import Widget

BLOCKS = " ▁▂▃▄▅▆▇█"
NONFINITE_MARK = "×"
#: Drawn on the top row over a marked point (the compile step), which is left out of the scale.
POINT_MARK = "▲"
GUTTER = 7  # columns left of the bars for the scale and the series name

Reduce = Literal["max", "mean", "last"]


@dataclass(frozen=True)
class BarSeries:
    """What to plot. ``values`` oldest first; ``None`` = not measured, nan/inf = non-finite."""

    values: tuple[float | None, ...]
    lo: float
    hi: float
    name: str = ""
    top_label: str = ""  # what the top of the scale means, e.g. "40ms"
    reduce: Reduce = "max"
    marked: tuple[int, ...] = ()  # indexes into ``values`` drawn with POINT_MARK on the top row
    bottom_label: str = ""  # the bottom of the scale (default: the series name)
    axis: tuple[str, str] = ("", "")  # labels under the first and last column (e.g. steps)
    empty: str = "no data yet"  # shown when no value is measured


_REDUCERS: dict[str, Callable[[list[float]], float]] = {
    "max": max,
    "mean": lambda xs: sum(xs) / len(xs),
    "last": lambda xs: xs[-1],
}


def bucket(values: Sequence[float | None], width: int, reduce: Reduce = "max") -> list[float | None]:
    """``width`` columns from ``values``: right-aligned when they fit, else equal index buckets.

    Two series of the same length bucket identically, so plots of them share a time axis. A
    bucket holding a non-finite value becomes nan (shown, never averaged away).
    """
    n = len(values)
    if width <= 0:
        return []
    if n <= width:
        return [None] * (width - n) + list(values)
    fn = _REDUCERS[reduce]
    out: list[float | None] = []
    for i in range(width):
        part = values[i * n // width : (i + 1) * n // width]
        present = [v for v in part if v is not None]
        if not present:
            out.append(None)
        elif any(not math.isfinite(v) for v in present):
            out.append(math.nan)
        else:
            out.append(fn(present))
    return out


def bar_rows(columns: Sequence[float | None], height: int, lo: float, hi: float) -> list[str]:
    """Rows of glyphs, top row first. Non-finite columns get a mark on the bottom row."""
    height = max(1, height)
    levels = height * 8
    span = hi - lo if hi > lo else 1.0
    heights: list[int | None] = []
    for v in columns:
        if v is None:
            heights.append(0)
        elif not math.isfinite(v):
            heights.append(None)
        else:
            frac = min(1.0, max(0.0, (v - lo) / span))
            # Any measured value shows at least a sliver, so "tiny" differs from "absent".
            heights.append(max(1, round(frac * levels)))
    rows = []
    for r in range(height - 1, -1, -1):  # r = 0 is the bottom row
        chars = []
        for h in heights:
            if h is None:
                chars.append(NONFINITE_MARK if r == 0 else " ")
            else:
                chars.append(BLOCKS[min(8, max(0, h - r * 8))])
        rows.append("".join(chars))
    return rows


def marked_columns(n: int, width: int, marked: Sequence[int]) -> set[int]:
    """The plot columns holding the marked indexes, bucketed as :func:`bucket` does."""
    if n <= width:
        return {width - n + i for i in marked if 0 <= i < n}
    return {min(width - 1, i * width // n) for i in marked if 0 <= i < n}


def render_series(series: BarSeries | None, width: int, height: int) -> Content:
    """The plot with its gutter: scale on the top row, series name on the bottom row."""
    if width <= GUTTER or height <= 0:
        return Content("")
    plot_width = width - GUTTER
    if series is None or not any(v is not None for v in series.values):
        name = (series.name if series else "").ljust(GUTTER)[:GUTTER]
        return Content.assemble(*(["\n"] * (height - 1)), (name, "dim"),
                                (series.empty if series else "no data yet", "dim"))
    cols = bucket(series.values, plot_width, series.reduce)
    axis = any(series.axis) and height >= 3
    rows = bar_rows(cols, height - 1 if axis else height, series.lo, series.hi)
    marks = marked_columns(len(series.values), plot_width, series.marked)
    if marks:
        top = list(rows[0])
        for c in marks:
            top[c] = POINT_MARK
        rows[0] = "".join(top)
    lines: list[Content] = []
    for i, row in enumerate(rows):
        if i == 0 and height > 1:
            label = series.top_label
        elif i == len(rows) - 1:
            label = series.bottom_label or series.name
        else:
            label = ""
        line = Content.assemble((label.rjust(GUTTER - 1)[: GUTTER - 1] + " ", "dim"), row)
        if i == 0:
            for c in marks:
                line = line.stylize("$warning bold", GUTTER + c, GUTTER + c + 1)
        if NONFINITE_MARK in row:
            for j, ch in enumerate(row):
                if ch == NONFINITE_MARK:
                    line = line.stylize("$error bold", GUTTER + j, GUTTER + j + 1)
        lines.append(line)
    if axis:
        left, right = series.axis
        # The first column's label, then the last's at the right edge (the plot may not be full).
        used = sum(1 for c in cols if c is None)
        gap = max(1, plot_width - used - len(left) - len(right))
        text = (" " * used + left + " " * gap + right)[-plot_width:] if used + len(left) + len(right) < plot_width \
            else (left + " " + right)[:plot_width]
        lines.append(Content.styled(" " * GUTTER + text, "dim"))
    return Content("\n").join(lines)


class HistoryBars(Widget):
    """Plots one :class:`BarSeries`; its height is the CSS height.

    A new series repaints only the span of columns whose glyphs changed: a bucket of many records
    mostly keeps its glyph from one frame to the next, and a full repaint of every plot each
    frame was most of the dashboard's terminal output.
    """

    DEFAULT_CSS = """
    HistoryBars { height: 3; color: $primary; }
    """

    series: reactive[BarSeries | None] = reactive(None, repaint=False)
    _drawn: tuple[tuple[int, int], Content, list[str]] | None = None  # (size, content, plain rows)

    def render(self) -> Content:
        return self._draw()[1]

    def _draw(self) -> tuple[tuple[int, int], Content, list[str]]:
        size = (self.size.width, self.size.height)
        if self._drawn is None or self._drawn[0] != size:
            content = render_series(self.series, *size)
            self._drawn = (size, content, content.plain.split("\n"))
        return self._drawn

    def watch_series(self, series: BarSeries | None) -> None:
        old = self._drawn
        self._drawn = None
        if old is None or not self.is_mounted:
            self.refresh()
            return
        new = self._draw()
        if new[0] != old[0] or len(new[2]) != len(old[2]):
            self.refresh()
            return
        changed = [i for a, b in zip(old[2], new[2]) if a != b for i in _differing(a, b)]
        if changed:
            left, right = min(changed), max(changed)
            self.refresh(Region(left, 0, right - left + 1, self.size.height))


def _differing(a: str, b: str) -> list[int]:
    """Column indexes where two rows differ (a length change counts from the shorter end)."""
    cols = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(a) != len(b):
        cols.extend((min(len(a), len(b)), max(len(a), len(b)) - 1))
    return cols

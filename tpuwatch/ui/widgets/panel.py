"""The base of every dashboard panel: a bordered, focusable box that renders from a snapshot."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.ui.printable_content import printable_content

#: State classes a panel may carry; the stylesheet colours borders and titles from them.
STATE_CLASSES = ("-stale", "-warning", "-critical")
#: Rows a panel's body may use when it is expanded to the whole screen (it scrolls).
EXPANDED_ROWS = 10_000


class Panel(Widget, can_focus=True):
    """Subclasses set ``TITLE`` and implement :meth:`body` (a pure function of the snapshot)
    and optionally :meth:`state` and :meth:`update_extra` for child widgets such as plots.

    The app binds its one ``snapshot`` reactive to every panel (``data_bind``); a panel never
    reads anything else.
    """

    # Scroll keys for an expanded panel (its content is then as long as it needs to be).
    BINDINGS = [
        Binding("up", "scroll_up", "Up", show=False),
        Binding("down", "scroll_down", "Down", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("pagedown", "page_down", "Page down", show=False),
    ]

    TITLE = ""
    #: Snapshots are compared by identity, not by value: comparing long histories per refresh
    #: would cost more than drawing them.
    #: No automatic repaint: the body repaints itself only when its text or styles changed (a
    #: full repaint 4 times a second cost ~144 KB/s of terminal output over SSH; now ~14 KB/s).
    snapshot: reactive[RunSnapshot] = reactive(RunSnapshot, always_update=True, repaint=False)
    _shown: tuple | None = None

    def compose(self) -> ComposeResult:
        yield Static(classes="body", markup=False)

    def on_mount(self) -> None:
        self.border_title = self.TITLE
        self.watch_snapshot(self.snapshot)

    def on_resize(self) -> None:
        self.watch_snapshot(self.snapshot)

    def watch_snapshot(self, snapshot: RunSnapshot) -> None:
        if not self.is_mounted:
            return
        body = self.query_one(".body", Static)
        # Expanded (Enter or z): everything, and the panel scrolls; else what fits the box.
        rows = EXPANDED_ROWS if self.has_class("-maximised") else max(1, body.size.height)
        content = printable_content(self.body(snapshot, rows, max(1, body.size.width)))
        # Content equality compares text only: the spans (colours) count too.
        key = (content.plain, tuple(content.spans))
        if key != self._shown:
            self._shown = key
            body.update(content, layout=False)  # body sizes come from the stylesheet
        wanted = self.state(snapshot)
        for cls in STATE_CLASSES:
            self.set_class(cls == wanted, cls)
        self.update_extra(snapshot)

    def body(self, snapshot: RunSnapshot, rows: int, width: int) -> Content:
        raise NotImplementedError

    def state(self, snapshot: RunSnapshot) -> str | None:
        """One of :data:`STATE_CLASSES`, or ``None`` for calm."""
        return None

    def update_extra(self, snapshot: RunSnapshot) -> None:
        """Hook for panels with children other than the body."""

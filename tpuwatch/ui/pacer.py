"""When the dashboard shows a new snapshot: at the rate a person reads numbers, at once for news.

The app drains its source several times a second (so it never falls behind a fast run and a
finding is evaluated on fresh data), but redrawing every panel at that rate changes numbers faster
than anyone reads them and costs terminal bytes, which matter over SSH: a frame of the 120x40
dashboard is ~3.5 KB. So a drained snapshot is *shown* when something a person must see at once
changed (a finding, a command's progress, an event, a retrace, a worker's connection, the epoch,
the end of the run: ``RunState.version``; not who a worker is, its hello, strategy and config:
a pod's thousand hosts join over seconds), and otherwise at most once every ``period_s`` (1 s: the
header's clock ticks once a second, like ``top -d 1``). Charts ride on the same frames; they change only where their glyphs
change (see ``HistoryBars``).

Watching ``RunState.version`` instead of building a snapshot at every drain matters with many
workers: a snapshot computes every worker's rolling figures (a 256-host pod: ~10 ms a drain).
Status changes that come from the clock alone (a stall) wait for the next periodic frame.

Pure and clock-injected, so the policy is tested without an app.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Seconds between two frames when only numbers changed.
SHOW_PERIOD_S = 1.0


@dataclass
class Pacer:
    """``due(news, now)`` says whether to show the state drained so far; call it once per drain
    with what identifies the news (``RunState.version``: it changes whenever the state does) and a
    monotonic time in seconds.

    ``period_s`` = 0 shows every drain (tests that drive ``pull`` themselves).
    """

    period_s: float = SHOW_PERIOD_S
    _shown_at: float | None = field(default=None, init=False)
    _news: object = field(default=(), init=False)

    def due(self, news: object, now: float) -> bool:
        show = (
            self.period_s <= 0
            or self._shown_at is None
            or news != self._news
            # A 4 Hz drain lands 1.0 s after the last frame give or take timer jitter: 0.9 keeps
            # it the 4th drain, not the 5th.
            or now - self._shown_at >= 0.9 * self.period_s
            # A clock that went backwards (a test's, or a replay seek) must not freeze the screen.
            or now < self._shown_at
        )
        if show:
            self._shown_at, self._news = now, news
        return show

    def reset(self) -> None:
        """The next snapshot is shown whatever it holds (a replay seek, a resize)."""
        self._shown_at = None

"""Helpers for the dashboard tests: recorded runs, fixed clocks, screen text."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

from tpuwatch import rundir
from tpuwatch.monitor.recording import read_all
from tpuwatch.protocol import Message
from tpuwatch.sources.replay_source import ReplaySource
from tpuwatch.ui.app import TpuwatchApp

DATA = Path(__file__).resolve().parent.parent / "data"


def recording(name: str) -> list[Message]:
    messages, _ = read_all(DATA / f"{name}.jsonl")
    return messages


def last_t(messages: list[Message]) -> float:
    return max(m.t for m in messages if hasattr(m, "t"))


def screen_text(app: TpuwatchApp) -> str:
    """What the terminal shows now, as plain text lines."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


class FakeClock:
    """A settable clock: tests move time explicitly."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def ended_replay(name: str) -> ReplaySource:
    """A replay positioned at the end of a recording, paused (nothing moves while drawing)."""
    src = ReplaySource(recording(name), paused=True, clock=FakeClock(0.0))
    src.seek_end()
    return src


def make_live_run(tmp_path: Path, name: str, *, upto: int | None = None, output: str = "") -> Path:
    """A run directory whose events.jsonl holds the first ``upto`` lines of a recording."""
    run = tmp_path / "run"
    rundir.create(run)
    lines = (DATA / f"{name}.jsonl").read_bytes().splitlines(keepends=True)
    (run / rundir.EVENTS).write_bytes(b"".join(lines[:upto]))
    (run / rundir.OUTPUT).write_text(output)
    return run


def sync(fn):
    """Runs an ``async def`` test in a fresh event loop (no pytest async plugin is installed);
    fixtures still reach it: ``functools.wraps`` keeps the signature pytest inspects."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return run


async def until_shown(pilot, app: TpuwatchApp, *texts: str, timeout_s: float = 10.0) -> str:
    """The screen's text once it shows every one of ``texts`` (repaints and toasts can lag on a
    loaded machine), or the last text seen after ``timeout_s``: the caller's assertions then say
    what was there."""
    shown = screen_text(app)
    for _ in range(int(timeout_s / 0.1)):
        if all(text in shown for text in texts):
            break
        await pilot.pause(0.1)
        shown = screen_text(app)
    return shown

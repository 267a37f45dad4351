"""Fixtures for the dashboard tests (helpers live in ui_support.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from tpuwatch.protocol import Command
from tpuwatch.ui.app import TpuwatchApp
from tpuwatch.ui.file_source import FileSource
from ui_support import FakeClock, last_t, make_live_run, recording


@pytest.fixture
def sent() -> list[Command]:
    return []


@pytest.fixture
def live_app(tmp_path: Path, sent: list[Command]) -> Callable[..., TpuwatchApp]:
    """Builds an app tailing a live-looking run (the recording cut mid-training)."""

    def build(name: str = "healthy_4replica", upto: int = 200, can_send: bool = True, output: str = "") -> TpuwatchApp:
        run = make_live_run(tmp_path, name, upto=upto, output=output)
        messages = recording(name)[:upto]
        source = FileSource(run, send=sent.append if can_send else None)
        return TpuwatchApp(source, run_dir=run, clock=FakeClock(last_t(messages) + 0.5), refresh_hz=0)

    return build


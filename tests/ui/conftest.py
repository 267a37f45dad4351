"""Fixtures for the dashboard tests (helpers live in ui_support.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest

# The helpers module sits next to this file; make it importable under any pytest import mode
# (importlib mode does not put test folders on sys.path).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ui_support import FakeClock, last_t, make_live_run, recording  # noqa: E402

from tpuwatch.protocol import Command  # noqa: E402
from tpuwatch.sources.file_source import FileSource  # noqa: E402
from tpuwatch.ui.app import TpuwatchApp  # noqa: E402


@pytest.fixture(autouse=True)
def whole_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refresh reads everything the test's recording holds. The dashboard's 0.15 s budget per
    read (what keeps a live UI responsive) cut the first read short on a loaded machine, and a
    snapshot then drew part of the run. Tests of the budget set their own."""
    from tpuwatch.ui import source_reader

    monkeypatch.setattr(source_reader, "APPLY_BUDGET_S", 30.0)


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


"""Pictures of the dashboard (pytest-textual-snapshot), at 80x24 and 160x48.

Deterministic by construction: recordings with fixed times, a fixed clock, no refresh timer
(the app is drawn from one pull), no blinking cursor. Update with ``--snapshot-update`` only
after looking at ``snapshot_report.html``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ui_support import FakeClock, last_t, make_live_run, recording

from tpuwatch.sources.file_source import FileSource
from tpuwatch.ui.app import TpuwatchApp

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")]

OUTPUT = (
    "2025-06-15 12:00:01 I tensorflow: Using MirroredStrategy with devices ('/CPU:0', '/CPU:1', '/CPU:2', '/CPU:3')\n"
    "Epoch 1/3\n"
    "100/100 - 5s - 50ms/step - loss: 1.2871\n"
    "Epoch 2/3\n"
)


def live(tmp_path: Path, name: str, upto: int | None, after_s: float = 0.5) -> TpuwatchApp:
    run = make_live_run(tmp_path, name, upto=upto, output=OUTPUT)
    messages = recording(name)[:upto]
    source = FileSource(run, send=lambda command: None)
    return TpuwatchApp(source, run_dir=run, clock=FakeClock(last_t(messages) + after_s), refresh_hz=0)


@pytest.mark.parametrize("size", SIZES)
def test_waiting_for_first_step(snap_compare, tmp_path, size) -> None:
    assert snap_compare(live(tmp_path, "waiting", None, after_s=3.0), terminal_size=size)


@pytest.mark.parametrize("size", [*SIZES, pytest.param((120, 40), id="120x40")])
def test_healthy_run(snap_compare, tmp_path, size) -> None:
    assert snap_compare(live(tmp_path, "healthy_4replica", 300), terminal_size=size)


@pytest.mark.parametrize("size", SIZES)
def test_input_bound_run(snap_compare, tmp_path, size) -> None:
    assert snap_compare(live(tmp_path, "input_bound", 400), terminal_size=size)


@pytest.mark.parametrize("size", SIZES)
def test_crashed_run(snap_compare, tmp_path, size) -> None:
    assert snap_compare(live(tmp_path, "crashed", None), terminal_size=size)


@pytest.mark.parametrize("size", SIZES)
def test_quit_dialog(snap_compare, tmp_path, size) -> None:
    assert snap_compare(live(tmp_path, "healthy_4replica", 300), terminal_size=size, press=["q"])


def test_crashed_run_no_color(snap_compare, tmp_path, monkeypatch) -> None:
    # NO_COLOR: Textual renders monochrome; the status and the NaN replica still read in words.
    monkeypatch.setenv("NO_COLOR", "1")
    app = live(tmp_path, "crashed", None)
    assert app.no_color
    assert snap_compare(app, terminal_size=(80, 24))


@pytest.mark.parametrize("size", SIZES)
def test_results_screen(snap_compare, tmp_path, size) -> None:
    # r: every command with its whole result (the recording holds a finished checkpoint).
    assert snap_compare(live(tmp_path, "healthy_4replica", 300), terminal_size=size, press=["r"])


@pytest.mark.parametrize("size", [*SIZES, pytest.param((120, 40), id="120x40")])
def test_expanded_retraces(snap_compare, tmp_path, size) -> None:
    # 6 focuses the Retraces panel (at 80x24, where it has no room, shows it expanded); enter
    # expands it: every retrace with its step and whole change, the footer says esc goes back.
    press = ["6"] if size == (80, 24) else ["6", "enter"]
    assert snap_compare(live(tmp_path, "healthy_4replica", 300), terminal_size=size, press=press)


@pytest.mark.parametrize("size", SIZES)
def test_expanded_findings(snap_compare, tmp_path, size) -> None:
    # 4 focuses Findings; z expands it to the whole screen (a crash: the findings are long).
    assert snap_compare(live(tmp_path, "crashed", None), terminal_size=size, press=["4", "z"])


@pytest.mark.parametrize("size", [pytest.param((80, 24), id="80x24"), pytest.param((120, 40), id="120x40")])
@pytest.mark.parametrize("panel", ["1", "2"])
def test_expanded_chart(snap_compare, tmp_path, size, panel) -> None:
    # 1 z: step time with its step axis and legend; 2 z: the loss chart using the height.
    assert snap_compare(live(tmp_path, "healthy_4replica", 300), terminal_size=size, press=[panel, "z"])

"""The README's picture of the dashboard (docs/dashboard.svg) is what docs/make_screenshot.py draws
now: a dashboard change that alters it fails here until the picture is regenerated
(`python docs/make_screenshot.py`), so the README never shows an old dashboard."""

from __future__ import annotations

import html
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _normal(svg: str) -> str:
    # Rich names the SVG's CSS classes after a hash of the content: alike when the content is.
    return re.sub(r"terminal-\d+", "terminal-N", svg)


def test_the_committed_screenshot_matches_a_regeneration() -> None:
    spec = importlib.util.spec_from_file_location("make_screenshot", ROOT / "docs" / "make_screenshot.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fresh = module.render()
    shown = html.unescape(fresh).replace("\xa0", " ")
    assert "Step time" in shown and "Loss per replica" in shown  # the live dashboard, mid-run
    # what no other tool shows: a finding naming the script's line, and where the time went
    assert "retrace storm" in shown and "retrace_storm.py:61" in shown and "No findings" not in shown
    assert "9 Goodput" in shown and "compiling" in shown
    committed = (ROOT / "docs" / "dashboard.svg").read_text()
    assert _normal(fresh) == _normal(committed), "the dashboard changed: run `python docs/make_screenshot.py`"


def test_the_readme_shows_it_first() -> None:
    readme = (ROOT / "README.md").read_text()
    head = readme[:1500]
    assert "docs/dashboard.svg" in head, head
    assert "pip install" in readme[:2500] and "tpuwatch run" in readme[:2500]

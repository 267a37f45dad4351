"""The repository stands alone: no comment, docstring or doc points at a document or an issue
thread that is not in it (a design note's section sign, a style rule's number, an issue number).
Whoever clones the project must be able to follow every reference; what the code relies on is in
``docs/`` (``docs/architecture.md``: the TensorFlow facts it rests on). Upstream projects' public
issues (``keras-team/keras#19246``) are fine: anyone can open them."""

from __future__ import annotations

import re

from tpuwatch_testing import ROOT

#: Spelled in pieces so that this file does not match itself.
_OUTSIDE = re.compile("|".join([
    r"\b" + "DES" + "IGN" + r"\b",
    r"\b" + "STYLE" + r"(\.md|\s*#\s*\d)",
    "\u00a7",  # a section sign: "see section 4" of a document that is not here
    r"(?<![/\w#])" + "[Ii]ssues?" + r"[\s-]+#?\d+",
]))
#: Where references are read: the code, its tests and benches, the docs and CI.
_TREES = ("tpuwatch", "tests", "bench", "docs", ".ci", "sample_runs")
_SUFFIXES = {".py", ".md", ".tcss", ".toml", ".sh", ".txt", ""}


def _files():
    yield ROOT / "README.md"
    yield ROOT / "pyproject.toml"
    for tree in _TREES:
        for p in sorted((ROOT / tree).rglob("*")):
            if (p.is_file() and p.suffix in _SUFFIXES and "__pycache__" not in p.parts
                    and "__snapshots__" not in p.parts):
                yield p


def test_no_reference_points_outside_the_repository():
    found = []
    for path in _files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            m = _OUTSIDE.search(line)
            if m:
                found.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)!r} in {line.strip()[:100]}")
    assert not found, f"{len(found)} reference(s) to documents or issues outside the repository:\n" + "\n".join(found)


def test_the_pattern_finds_what_it_looks_for():
    for text in ("Rules (" + "DES" + "IGN \u00a74):", "(" + "STY" + "LE #5)", "(iss" + "ue 26, item 6)",
                 "Iss" + "ue 28 item 2:", "see DES" + "IGN.md",
                 "#the-pipeline-map-iss" + "ue-25"):
        assert _OUTSIDE.search(text), text
    for text in ("keras-team/keras#20585", "_STYLE = {", "an issue with 3 replicas", "tissue 5"):
        assert not _OUTSIDE.search(text), text

"""``tpuwatch --help`` and every command's ``--help``, byte for byte as recorded in
tests/cli/help/ (the parser moved out of one file into a module per command; the
text a user reads must not change with it). A deliberate change to the help regenerates the
files: ``python tests/cli/test_cli_help.py``."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import pytest

from tpuwatch.cli import main

HELP = Path(__file__).resolve().parent / "help"
COMMANDS = ("run", "attach", "replay", "report", "export", "compare", "ls", "profile", "checkpoint", "doctor")


def help_text(command: str | None) -> str:
    """What ``tpuwatch [COMMAND] --help`` prints at 100 columns."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([command, "--help"] if command else ["--help"])
    return out.getvalue()


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_is_unchanged(command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    expected = (HELP / f"{command or 'tpuwatch'}.txt").read_text(encoding="utf-8")
    assert help_text(command) == expected


if __name__ == "__main__":
    import os

    os.environ["COLUMNS"] = "100"
    for name in (None, *COMMANDS):
        (HELP / f"{name or 'tpuwatch'}.txt").write_text(help_text(name), encoding="utf-8")
    sys.exit(0)

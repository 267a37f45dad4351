"""The architecture's boundaries, proved at run time (DESIGN §2): each part is imported in a fresh
interpreter and what it dragged into ``sys.modules`` is checked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tpuwatch_testing import ROOT

HEAVY = ("tensorflow", "keras", "tf_keras", "textual", "rich")


def _modules_after(statement: str) -> set[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _top(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


@pytest.mark.parametrize("module", ["tpuwatch", "tpuwatch.protocol", "tpuwatch.rundir"])
def test_core_modules_import_only_the_standard_library(module):
    extra = _top(_modules_after(f"import {module}")) - _top(_modules_after("pass"))
    assert extra <= {"tpuwatch"} | set(sys.stdlib_module_names), sorted(extra)


def test_cli_and_monitor_never_import_tensorflow_or_textual():
    monitor = sorted(p.stem for p in (ROOT / "tpuwatch" / "monitor").glob("*.py") if p.stem != "__init__")
    mods = _modules_after("import tpuwatch.cli, tpuwatch.monitor.diagnostics, "
                          + ", ".join(f"tpuwatch.monitor.{m}" for m in monitor))
    assert not _top(mods) & set(HEAVY), sorted(_top(mods) & set(HEAVY))
    assert not any(m.startswith(("tpuwatch.agent", "tpuwatch.ui")) for m in mods)


def test_ui_never_imports_tensorflow_or_the_agent():
    ui = sorted(p.stem for p in (ROOT / "tpuwatch" / "ui").glob("*.py") if p.stem != "__init__")
    mods = _modules_after("import " + ", ".join(f"tpuwatch.ui.{m}" for m in ui))
    assert "textual" in _top(mods)
    assert not _top(mods) & {"tensorflow", "keras", "tf_keras"}
    assert not any(m.startswith("tpuwatch.agent") for m in mods)


def test_agent_never_imports_textual_or_the_viewer_side():
    agent = sorted(p.stem for p in (ROOT / "tpuwatch" / "agent").glob("*.py") if p.stem not in ("__init__", "__main__"))
    statement = "import " + ", ".join(f"tpuwatch.agent.{m}" for m in agent)
    mods = _modules_after(statement)
    assert not _top(mods) & {"textual", "rich"}
    assert not any(m.startswith(("tpuwatch.monitor", "tpuwatch.ui", "tpuwatch.cli")) for m in mods)


def test_help_is_fast_and_needs_no_tensorflow():
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "tpuwatch", "--help"], capture_output=True,
                         text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and "tpuwatch run" in out.stdout
    assert "tensorflow" not in out.stderr and "textual" not in out.stderr

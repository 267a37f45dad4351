"""The architecture's boundaries, proved at run time: every module of each part is
imported in a fresh interpreter and what it dragged into ``sys.modules`` is checked. The same
layers are checked statically by import-linter (``[tool.importlinter]`` in pyproject.toml), which
also sees imports made inside functions."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tpuwatch_testing import ROOT

TF = {"tensorflow", "keras", "tf_keras"}
TEXTUAL = {"textual", "rich"}
#: The parts above a part (they may import it, never the other way round).
LAYERS = ("tpuwatch.monitor", "tpuwatch.control", "tpuwatch.sources", "tpuwatch.console", "tpuwatch.ui")


def _modules_after(statement: str) -> set[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _top(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def _every_module(package: str) -> list[str]:
    """Every module of ``package``, sub-packages included (``__main__`` is a program, not a module)."""
    base = ROOT / package.replace(".", "/")
    mods = []
    for p in sorted(base.rglob("*.py")):
        if p.stem == "__main__":
            continue
        parts = p.relative_to(ROOT).with_suffix("").parts
        mods.append(".".join(parts[:-1] if p.stem == "__init__" else parts))
    assert mods, package
    return mods


def _import_all(package: str) -> set[str]:
    return _modules_after("\n".join(f"import {m}" for m in _every_module(package)))


@pytest.mark.parametrize("module", ["tpuwatch", "tpuwatch.protocol", "tpuwatch.rundir", "tpuwatch.api", "tpuwatch.settings",
                                    "tpuwatch.address", "tpuwatch.units", "tpuwatch.figures",
                                    "tpuwatch.printable"])
def test_core_modules_import_only_the_standard_library(module):
    extra = _top(_modules_after(f"import {module}")) - _top(_modules_after("pass"))
    assert extra <= {"tpuwatch"} | set(sys.stdlib_module_names), sorted(extra)


@pytest.mark.parametrize("package", LAYERS[:-1])
def test_viewer_parts_never_import_tensorflow_textual_or_a_part_above(package):
    mods = _import_all(package)
    assert not _top(mods) & (TF | TEXTUAL), sorted(_top(mods) & (TF | TEXTUAL))
    above = ("tpuwatch.agent", "tpuwatch.cli", "tpuwatch.commands") + LAYERS[LAYERS.index(package) + 1:]
    assert not sorted(m for m in mods if m.startswith(above))


def test_cli_never_imports_tensorflow_or_textual_at_import_time():
    mods = _modules_after("import tpuwatch.cli")
    assert not _top(mods) & (TF | TEXTUAL), sorted(_top(mods) & (TF | TEXTUAL))
    assert not any(m.startswith(("tpuwatch.agent", "tpuwatch.ui")) for m in mods)


def test_ui_never_imports_tensorflow_or_the_agent():
    mods = _import_all("tpuwatch.ui")
    assert "textual" in _top(mods)
    assert not _top(mods) & TF
    assert not any(m.startswith(("tpuwatch.agent", "tpuwatch.cli", "tpuwatch.commands", "tpuwatch.console")) for m in mods)


def test_agent_never_imports_textual_or_the_viewer_side():
    mods = _import_all("tpuwatch.agent")
    assert not _top(mods) & TEXTUAL
    assert not any(m.startswith(("tpuwatch.cli", "tpuwatch.commands") + LAYERS) for m in mods)


def test_help_is_fast_and_needs_no_tensorflow():
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "tpuwatch", "--help"], capture_output=True,
                         text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and "tpuwatch run" in out.stdout
    assert "tensorflow" not in out.stderr and "textual" not in out.stderr

"""No import circle in tpuwatch: the module graph, read from the source with ``ast``, is acyclic.

Every import counts, as import-linter counts them: at the top of a module, inside a function
(a lazy import), and under ``if TYPE_CHECKING:`` (a circle that only typing closes is still one
that a reader has to untangle). ``from package import name`` is an import of ``package.name``
where that is a module, else of ``package``. The agent's probes see its core through
``agent.agent_api`` (never ``agent.runtime``), the step probe's parts see it through
``agent.step_owner``; ``pyproject.toml`` holds the same two rules for the agent as contracts."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from tpuwatch_testing import ROOT

PACKAGE = ROOT / "tpuwatch"
#: The modules that may import the agent's core: the program that starts it, and the installer.
AGENT_WIRING = {"tpuwatch.agent.runtime", "tpuwatch.agent.__main__", "tpuwatch.agent.probes"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if path.stem == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(module: str, path: Path, known: set[str]) -> dict[str, int]:
    """The tpuwatch modules ``module`` imports, each with the line of its first import."""
    package = module if path.stem == "__init__" else module.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for name in names:
            if name in known and name != module:
                found.setdefault(name, node.lineno)
    return found


@functools.cache
def _graph() -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    mods = _modules()
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}, mods


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _one_loop(graph: dict[str, dict[str, int]], component: list[str]) -> str:
    """One circle through ``component``, as ``a (l.3) -> b (l.9) -> a``, for the failure message."""
    members = set(component)
    start = component[0]
    path, seen, v = [start], {start}, start
    while True:
        nxt = sorted(w for w in graph[v] if w in members)
        w = next((x for x in nxt if x == start), None) or next((x for x in nxt if x not in seen), nxt[0])
        path.append(f"(l.{graph[v][w]}) {w}")
        if w == start or w in seen:
            return " -> ".join(path)
        seen.add(w)
        v = w


def test_the_graph_reader_sees_every_kind_of_import():
    """The reader finds a lazy import, a TYPE_CHECKING one and a relative one (else the test
    below could pass on a graph with no edges)."""
    graph, _ = _graph()
    assert "tpuwatch.agent.agent_api" in graph["tpuwatch.agent.phases"]  # under TYPE_CHECKING
    assert "tpuwatch.agent.steps" in graph["tpuwatch.agent.runtime"]  # inside a method
    assert "tpuwatch.monitor.diagnostics.telemetry" in graph["tpuwatch.monitor.diagnostics.rule"]  # from .telemetry
    assert _cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("part", ["tpuwatch.agent", "tpuwatch.monitor", "tpuwatch"])
def test_no_import_circle(part):
    graph, _ = _graph()
    loops = [c for c in _cycles(graph) if any(m == part or m.startswith(part + ".") for m in c)]
    assert not loops, "import circles:\n" + "\n".join(_one_loop(graph, c) for c in loops)


def test_the_agents_probes_never_import_its_core():
    graph, _ = _graph()
    offenders = sorted(f"{m} (l.{imports['tpuwatch.agent.runtime']})" for m, imports in graph.items()
                       if m.startswith("tpuwatch.agent.") and m not in AGENT_WIRING
                       and "tpuwatch.agent.runtime" in imports)
    assert not offenders, f"type the agent as tpuwatch.agent.agent_api.Agent instead: {offenders}"

"""One home per worker record on each side.

The viewer side keeps everything about one agent process in one mutable record, read by the run
state and the diagnostics rules alike (``monitor.diagnostics.telemetry.Worker``); a source keeps
one record per worker stream or directory, from which its health is derived
(``sources.source.WorkerStream``). Six types once held a worker's facts, twice over, and they
disagreed. A new mutable dataclass keyed by a worker (a ``name`` or ``worker`` field) in
``monitor/`` or ``sources/`` fails here: put its fields on the side's record, or, if it is keyed
by something else as well, list it below with the reason.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re

from tpuwatch_testing import ROOT

#: The one mutable per-worker record of each side.
RECORDS = {
    "tpuwatch.monitor": "tpuwatch.monitor.diagnostics.telemetry.Worker",
    "tpuwatch.sources": "tpuwatch.sources.source.WorkerStream",
}
#: Mutable dataclasses with a worker key that are not records of a worker, and why.
NOT_WORKER_RECORDS = {
    # one traced function of one worker (the retrace rules' history of that function)
    "tpuwatch.monitor.diagnostics.tracing.FunctionHistory",
}


def _mutable_keyed_dataclasses(package: str) -> set[str]:
    pkg = importlib.import_module(package)
    found = set()
    for info in pkgutil.walk_packages(pkg.__path__, package + "."):
        mod = importlib.import_module(info.name)
        for name, obj in vars(mod).items():
            if not (inspect.isclass(obj) and dataclasses.is_dataclass(obj) and obj.__module__ == mod.__name__):
                continue
            if obj.__dataclass_params__.frozen:  # type: ignore[attr-defined]
                continue  # a value (a view, a directory entry), never updated
            fields = {f.name for f in dataclasses.fields(obj)}
            if fields & {"name", "worker"}:
                found.add(f"{mod.__name__}.{name}")
    return found


def test_each_side_has_one_mutable_record_per_worker():
    for package, record in RECORDS.items():
        found = _mutable_keyed_dataclasses(package) - NOT_WORKER_RECORDS
        assert found == {record}, (
            f"{package}: a worker's facts have one home, {record}; also found {sorted(found - {record})} "
            "(fold its fields into the record, or list it in NOT_WORKER_RECORDS with why it is no worker record)")


def test_the_workers_view_is_built_in_one_place():
    # WorkerView is the frozen snapshot of a record, made by one function from it
    calls = [(p.relative_to(ROOT), n) for p in sorted((ROOT / "tpuwatch").rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\bWorkerView\(", line)]
    assert [str(p) for p, _ in calls] == ["tpuwatch/monitor/state.py"], calls

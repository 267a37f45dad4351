"""run.json is updated by two processes at once (the launcher records the child's pid while the
agent records its socket): each read-modify-write must keep the other's keys. Before: the agent read
run.json, the launcher replaced it, the agent wrote its older copy back, and ``child_pid`` was lost."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from tpuwatch import rundir


def _writer(run_dir: str, prefix: str, n: int) -> None:
    for i in range(n):
        rundir.update_meta(Path(run_dir), **{f"{prefix}{i}": i})


def test_concurrent_updates_keep_every_key(tmp_path):
    rundir.write_meta(tmp_path, {"run_id": "x"})
    ctx = multiprocessing.get_context("spawn")
    n = 60
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), p, n)) for p in ("a", "b", "c")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    meta = rundir.read_meta(tmp_path)
    missing = [f"{p}{i}" for p in "abc" for i in range(n) if f"{p}{i}" not in meta]
    assert missing == [], f"{len(missing)} keys lost, e.g. {missing[:5]}"
    assert meta["run_id"] == "x"

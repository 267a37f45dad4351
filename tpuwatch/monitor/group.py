"""Multi-worker runs on one machine (``tpuwatch run --workers N``): the group directory and reading
its workers' recordings as one stream of messages, each tagged with its worker's name.

Layout: the group directory holds one complete run directory per worker, so every command that
works on a run works on a single worker too::

    <run>/run.json          the group: {"group": true, "workers": [{"name", "index", "dir"}...], ...}
    <run>/output.log        every worker's output, each line prefixed "[N] " (written by the launcher)
    <run>/worker-0/         events.jsonl, output.log, run.json, agent.sock, token of worker 0
    <run>/worker-1/         ...

A worker's name is ``worker:<index>``: what the agent calls itself from ``TF_CONFIG``
(:func:`tpuwatch.agent.environment.worker_name`), so the names from the directories and from the
streams' Hellos (``tpuwatch attach HOST:PORT ...``) agree. Messages are tagged with the name
from run.json, which is there before the agent has said hello and after it died without one.
"""

from __future__ import annotations

import heapq
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from tpuwatch import rundir
from tpuwatch.monitor.recording import ReadStats, RecordingReader, read_all
from tpuwatch.protocol import Message

#: ``(worker name, message)``: what a multi-worker source hands to ``RunState.apply(msg, worker)``.
Tagged = tuple[str, Message]


def worker_name(index: int) -> str:
    return f"worker:{index}"


def worker_dir_name(index: int) -> str:
    return f"worker-{index}"


@dataclass(frozen=True)
class WorkerDir:
    name: str  # "worker:0"
    index: int
    path: Path  # the worker's own run directory


def worker_dirs(run_dir: str | os.PathLike[str]) -> list[WorkerDir] | None:
    """The workers of a group directory, in index order; ``None`` when ``run_dir`` is a plain run."""
    run_dir = Path(run_dir)
    meta = rundir.read_meta(run_dir)
    entries = meta.get("workers")
    if not meta.get("group") or not isinstance(entries, list):
        return None
    out = []
    for n, e in enumerate(entries):
        if not isinstance(e, dict):
            continue
        index = e.get("index", n)
        index = index if isinstance(index, int) else n
        name, sub = e.get("name"), e.get("dir")
        name = name if isinstance(name, str) else worker_name(index)
        sub = sub if isinstance(sub, str) else worker_dir_name(index)
        out.append(WorkerDir(name=name, index=index, path=run_dir / sub))
    return sorted(out, key=lambda w: w.index)


def sum_stats(stats: Sequence[ReadStats]) -> ReadStats:
    return ReadStats(
        messages=sum(s.messages for s in stats),
        malformed=sum(s.malformed for s in stats),
        unknown=sum(s.unknown for s in stats),
        bytes_read=sum(s.bytes_read for s in stats),
        truncated_tail=any(s.truncated_tail for s in stats),
        dropped_bytes=sum(s.dropped_bytes for s in stats),
        last_error=next((s.last_error for s in stats if s.last_error), ""),
    )


class GroupReader:
    """Tails every worker's ``events.jsonl``; :meth:`read_new` returns tagged messages.

    Each worker's messages keep their order; between workers, each call hands over what every
    recording grew by (the state is per worker, so interleaving within a call does not matter).
    Not thread-safe: one reader per consumer.
    """

    def __init__(self, workers: Sequence[WorkerDir], *, max_bytes_per_read: int | None = None) -> None:
        kw = {} if max_bytes_per_read is None else {"max_bytes_per_read": max_bytes_per_read}
        #: (worker name, the reader of its recording), in index order
        self._readers = [(w.name, RecordingReader(w.path / rundir.EVENTS, **kw)) for w in workers]

    @property
    def caught_up(self) -> bool:
        return all(r.caught_up for _, r in self._readers)

    @property
    def stats(self) -> ReadStats:
        return sum_stats([r.stats for _, r in self._readers])

    def read_new(self) -> list[Tagged]:
        out: list[Tagged] = []
        for name, r in self._readers:
            out.extend((name, m) for m in r.read_new())
        return out

    def finish(self) -> list[Tagged]:
        """The rest of every recording, at the end of the run (a cut last line counts as cut)."""
        out: list[Tagged] = []
        for name, r in self._readers:
            out.extend((name, m) for m in r.finish())
        return out


def _release_times(messages: Sequence[Message]) -> list[float]:
    """Each message's time, never earlier than the one before it (messages without a time, such as
    commands, keep their place in their recording)."""
    out = []
    last = 0.0
    for m in messages:
        t = getattr(m, "t", None)
        if isinstance(t, (int, float)) and t > last:
            last = float(t)
        out.append(last)
    return out


def read_group(workers: Sequence[WorkerDir]) -> tuple[list[Tagged], ReadStats]:
    """Every worker's whole recording merged by time (for report and replay)."""
    streams = []
    stats = []
    for w in workers:
        path = w.path / rundir.EVENTS
        msgs, st = read_all(path) if path.is_file() else ([], ReadStats())
        stats.append(st)
        streams.append([(t, w.index, n, w.name, m) for n, (t, m) in enumerate(zip(_release_times(msgs), msgs))])
    merged: Iterator[tuple[float, int, int, str, Message]] = heapq.merge(*streams, key=lambda r: (r[0], r[1], r[2]))
    return [(name, m) for _, _, _, name, m in merged], sum_stats(stats)

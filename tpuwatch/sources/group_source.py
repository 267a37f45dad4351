"""Sources for a multi-worker run directory (``tpuwatch run --workers N``, ``attach``/``replay`` of
its group directory). Their worker health reaches the state through
:func:`tpuwatch.sources.source.apply_worker_health`.

Like :class:`~tpuwatch.sources.remote_source.RemoteSource`, these hand the dashboard
``(worker, message)`` pairs through ``poll_tagged()`` so one ``RunState`` keeps each worker apart
(``RunState.apply(msg, worker=name)``): per-host step time and memory, and global replica indexes
from each worker's topology. Nothing here imports Textual.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

from tpuwatch import rundir
from tpuwatch.control.client import AgentClient
from tpuwatch.monitor.group import GroupReader, Tagged, WorkerDir, read_group
from tpuwatch.monitor.recording import ReadStats
from tpuwatch.monitor.runs import run_alive
from tpuwatch.protocol import Command, Exit, Message
from tpuwatch.sources.replay_source import ReplaySource
from tpuwatch.sources.source import WorkerHealth, WorkerStream, broadcast, health_of

#: A worker whose process is gone and whose launcher recorded no end for this long is lost.
LOST_AFTER_S = 3.0


class GroupSource:
    """Tails every worker's recording in a group directory; commands go to every running agent."""

    live = True
    can_send = True

    def __init__(self, workers: Sequence[WorkerDir], *, clock: Callable[[], float] = time.monotonic,
                 run_alive: Callable[[dict], bool] = run_alive) -> None:
        self._reader = GroupReader(workers)
        self.streams = [WorkerStream(label=w.name, worker=w.name, dir=w, sender=AgentClient.for_run(w.path))
                        for w in workers]
        self._by_name = {s.label: s for s in self.streams}
        self._clock = clock
        self._run_alive = run_alive  # of a worker's run.json

    def poll(self) -> list[Message]:
        return [m for _, m in self.poll_tagged()]

    def poll_tagged(self) -> list[Tagged]:
        out = self._reader.read_new()
        for name, msg in out:
            stream = self._by_name[name]
            stream.seen = True
            if isinstance(msg, Exit):
                stream.ended = True
        return out

    @property
    def caught_up(self) -> bool:
        return self._reader.caught_up

    def finish(self) -> list[Tagged]:
        return self._reader.finish()

    def read_stats(self) -> ReadStats:
        return self._reader.stats

    def health(self) -> dict[str, WorkerHealth]:
        """``{worker: (connected, lost reason or None)}`` for workers seen and not ended: a worker
        whose process is gone with no end recorded (its launcher died too) is lost."""
        now = self._clock()
        for s in self.streams:
            if not s.seen or s.ended or s.dir is None:
                continue
            meta = rundir.read_meta(s.dir.path)
            if self._run_alive(meta) or isinstance(meta.get("exit_code"), int):
                s.connected, s.lost, s.gone_since = True, None, None  # running, or its end is on the way
                continue
            if s.gone_since is None:
                s.gone_since = now
            s.connected = False
            s.lost = (f"process {meta.get('child_pid')} is gone and left no exit record"
                      if now - s.gone_since >= LOST_AFTER_S else None)
        return health_of(self.streams)

    def send(self, command: Command) -> None:
        """Sends ``command`` to every worker still running (a checkpoint or profile of a
        multi-worker job concerns all of them). Raises OSError when none took it."""
        broadcast(command, ((s.label, s.sender.send) for s in self.streams
                            if s.sender is not None and not s.ended), "no worker is running any more")

    def now(self) -> float | None:
        return None

    def close(self) -> None:
        for s in self.streams:
            if s.sender is not None:
                s.sender.close()


class GroupReplaySource(ReplaySource):
    """A replay of every worker's recording, merged by time, each message with its worker."""

    def __init__(self, tagged: Sequence[Tagged], **kwargs: Any) -> None:
        super().__init__([m for _, m in tagged], **kwargs)
        self._tags = [w for w, _ in tagged]

    def poll_tagged(self) -> list[Tagged]:
        start = self._next
        out = self.poll()
        return list(zip(self._tags[start:start + len(out)], out))


def make_group_source(workers: Sequence[WorkerDir]) -> GroupSource:
    return GroupSource(workers)


def make_group_replay_source(workers: Sequence[WorkerDir], speed: float = 1.0, *,
                             paused: bool = False) -> GroupReplaySource:
    tagged, _stats = read_group(workers)
    if not tagged:
        raise FileNotFoundError(f"no recording in any worker of {Path(workers[0].path).parent}")
    return GroupReplaySource(tagged, speed=speed, paused=paused)

"""Hands a run's telemetry to the tools a team already runs (``--notify``, ``--metrics``,
``--tensorboard``) from the viewer's process, never from inside training.

:class:`Relay` is a thread of its own beside whatever view the user has (the dashboard, the
headless lines, a headless ``attach``): it tails the run's recording with its own
:class:`~tpuwatch.monitor.state.RunState` and findings engine, exactly as the headless console
does, and gives each *outlet* every message, the run about once a second, and the end. A slow
outlet can slow only this thread; the outlets that call out (alerts) do that on threads of their
own.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable, Protocol, Sequence

from tpuwatch.monitor.monitor import Monitor
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.protocol import Finding, Hello, Message
from tpuwatch.sources.source import RecordingSource, Tagged

#: How often the relay reads the recording and hands the run to its outlets (seconds).
POLL_S = 0.25
UPDATE_EVERY_S = 1.0
#: After the process has gone, how long to wait for its exit record (the launcher writes one when
#: the agent could not).
EXIT_GRACE_S = 5.0


class Outlet(Protocol):
    """Something that takes a run's telemetry out of tpuwatch."""

    def take(self, worker: str, msg: Message) -> None:
        """Every message of the run, in order, with the worker that sent it."""
        ...

    def update(self, snap: RunSnapshot, new_findings: Sequence[Finding]) -> None:
        """The run now (about once a second), and the findings new since the last call."""
        ...

    def close(self, snap: RunSnapshot, new_findings: Sequence[Finding]) -> None:
        """The run's last view (its end when ``snap.status`` says it ended; a viewer that leaves
        a live run closes too). Called once; may wait a bounded time for work in flight."""
        ...


class Relay:
    """Tails ``source`` on a thread and feeds ``outlets`` until :meth:`close` (or the run ends
    and the recording is read to its end).

    ``is_alive()`` says whether the training process still runs.
    """

    def __init__(self, source: RecordingSource, is_alive: Callable[[], bool], outlets: Sequence[Outlet], *,
                 clock: Callable[[], float] = time.time, poll_s: float = POLL_S,
                 exit_grace_s: float = EXIT_GRACE_S) -> None:
        self.source = source
        self.is_alive = is_alive
        self.outlets = list(outlets)
        self.clock = clock
        self.poll_s = poll_s
        self.exit_grace_s = exit_grace_s
        # The recording's findings are the owner's: this view's own engine makes the same ones.
        self.monitor = Monitor(clock, recorded_findings=False, step_figures=False)
        self.state = self.monitor.state
        self._hello_worker = ""
        self._leave = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tpuwatch-relay", daemon=True)
        self.error: Exception | None = None  # the relay itself failed (reading the recording)
        self.errors: list[str] = []  # outlets that failed and were dropped
        self.final: RunSnapshot | None = None

    def start(self) -> "Relay":
        self._thread.start()
        return self

    def close(self, timeout_s: float = 30.0) -> RunSnapshot | None:
        """Reads what is left, closes the outlets (the end of the run, when it has ended) and
        returns the last snapshot; waits at most ``timeout_s``."""
        self._leave.set()
        self._thread.join(timeout_s)
        return self.final

    # --- the thread ----------------------------------------------------------------------------

    def _take(self, tagged: Sequence[Tagged]) -> None:
        for worker, msg in tagged:
            if isinstance(msg, Hello) and worker is None:
                self._hello_worker = msg.worker
            name = worker if worker is not None else self._hello_worker
            self.monitor.take(msg, worker)
            for outlet in list(self.outlets):
                self._call(outlet, outlet.take, name, msg)

    def _drain(self) -> None:
        while True:
            self._take(self.source.poll_tagged())
            if self.source.caught_up:
                return

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as e:  # kept for the owner to report (Relay.error); the view goes on without it
            self.error = e
        finally:
            self.source.close()
            self._closed.set()

    def _loop(self) -> None:
        next_update = 0.0
        gone_since: float | None = None
        while True:
            self._drain()
            now = self.clock()
            if not self.is_alive():
                gone_since = now if gone_since is None else gone_since
                if self.state.ended or now - gone_since >= self.exit_grace_s:
                    break
            if self._leave.is_set():
                break
            self.monitor.evaluate(now)
            if now >= next_update:
                next_update = now + UPDATE_EVERY_S
                snap = self.monitor.snapshot(now)
                new = self.state.drain_new_findings()
                for outlet in list(self.outlets):
                    self._call(outlet, outlet.update, snap, new)
            self._leave.wait(self.poll_s)
        ended = not self.is_alive()
        if ended:
            self._take(self.source.finish())
            workers = self.monitor.snapshot(self.clock()).workers
            for w in workers:
                if w.status not in ("finished", "crashed", "stopped"):
                    self.state.set_lost("the process ended without an exit record", worker=w.name)
            if not workers and not self.state.ended:
                self.state.set_lost("the process ended without an exit record")
        end_t = self.state.last_message_t if ended and self.state.last_message_t is not None else self.clock()
        self.monitor.evaluate(end_t, force=True)
        snap = self.monitor.snapshot(end_t)
        self.final = snap
        new = self.state.drain_new_findings()
        for outlet in list(self.outlets):
            self._call(outlet, outlet.close, snap, new)

    def _call(self, outlet: Outlet, method: Callable[..., object], *args: object) -> None:
        """One outlet's failure (a full disk under --tensorboard) ends that outlet, said once
        (:attr:`errors`), never the others or the view."""
        try:
            method(*args)
        except Exception as e:  # reported by the owner at the end, with the outlet's name
            self.outlets.remove(outlet)
            self.errors.append(f"{type(outlet).__name__} stopped: {type(e).__name__}: {e}")


def relay_source(run_dir: Path) -> RecordingSource:
    """What a relay reads for ``run_dir``: its recording, or each worker's of a group directory."""
    from tpuwatch.monitor.group import worker_dirs
    from tpuwatch.sources.file_source import FileSource
    from tpuwatch.sources.group_source import GroupSource

    workers = worker_dirs(run_dir)
    return GroupSource(workers) if workers is not None else FileSource(run_dir)

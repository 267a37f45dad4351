"""A source that follows agents over TCP (``tpuwatch attach HOST:PORT [HOST:PORT...]``).

Each address gets one background thread that streams the agent's recording
(:meth:`AgentClient.stream`) from byte 0, decodes it off the UI thread, and puts the messages on
one bounded queue. When the queue is full the thread waits, so TCP pushes back on the agent and,
if the dashboard falls far behind, the agent drops the connection; the thread then reconnects
from the last whole line it received (nothing is lost or repeated: the recording is the truth).

Several streams feed one ``RunState``: :meth:`RemoteSource.poll_tagged` returns each message with
the worker name from its stream's ``hello``, for ``RunState.apply(msg, worker=name)``. With one
stream, :meth:`poll` is enough. Nothing here imports Textual.

Summaries: attached to more than :data:`SUMMARY_ABOVE_HOSTS` agents (or when asked), each stream
asks its agent for the summary stream (:mod:`tpuwatch.agent.summary`): one ``host_summary`` a
second in place of the step records and samples. The primary worker (``worker_index`` 0, whose
steps the run's charts and rates follow) is switched to its full stream as soon as its topology
says who it is, and :meth:`RemoteSource.zoom` does the same for any worker: the stream re-attaches
from the byte offset it has accounted for, so nothing is lost or repeated. An agent that predates
summaries ignores the request and streams every line, which the viewer takes as it always did.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Mapping, Sequence

from tpuwatch.control.client import AgentClient, AgentUnavailable
from tpuwatch.monitor.recording import ReadStats
from tpuwatch.protocol import Command, Decoder, Event, Exit, Hello, HostSummary, Message, Topology
from tpuwatch.sources.source import Tagged, WorkerHealth, WorkerStream, broadcast, health_of

#: Messages held between the stream threads and the dashboard (all streams together).
QUEUE_MESSAGES = 50_000
#: Most messages one poll hands over. The app polls again while its drain budget lasts, and it
#: checks the budget between polls: 2,000 messages (~0.1 s to apply) keep a viewer of 64 hosts
#: catching up from freezing for a second at a time, as 20,000 did.
POLL_MESSAGES = 2_000
#: Reconnect back-off, seconds: doubles from the first to the last value.
RECONNECT_S = (0.25, 5.0)
#: Attached to more agents than this, a viewer asks them for summaries (``--summaries auto``).
SUMMARY_ABOVE_HOSTS = 16



class RemoteSource:
    """Follows one or more agents over TCP with the run's token."""

    live = True
    can_send = True

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        token: str,
        *,
        client_factory: Callable[..., AgentClient] = AgentClient,
        queue_messages: int = QUEUE_MESSAGES,
        reconnect_s: tuple[float, float] = RECONNECT_S,
        clock: Callable[[], float] = time.time,
        summary: bool | None = None,
    ) -> None:
        """``summary``: ask every agent for summaries (True), for every line (False), or
        summaries when there are more than :data:`SUMMARY_ABOVE_HOSTS` agents (None)."""
        if not addresses:
            raise ValueError("RemoteSource needs at least one HOST:PORT")
        if summary is None:
            summary = len(addresses) > SUMMARY_ABOVE_HOSTS
        self.summary = summary
        self.streams = [WorkerStream(label=f"{host}:{port}", address=(host, port), summary=summary,
                                     sender=client_factory(tcp=(host, port), token=token))
                        for host, port in addresses]
        self._token = token
        self._factory = client_factory
        self._queue: queue.Queue[Tagged] = queue.Queue(maxsize=queue_messages)
        self._reconnect_s = reconnect_s
        self._clock = clock
        self._threads = [
            threading.Thread(target=self._follow, args=(s,), name=f"tpuwatch-remote-{s.label}", daemon=True)
            for s in self.streams
        ]
        for t in self._threads:
            t.start()

    # --- Source ------------------------------------------------------------------------------

    def poll(self) -> list[Message]:
        return [msg for _, msg in self.poll_tagged()]

    def poll_tagged(self) -> list[Tagged]:
        """New messages with the worker name of the stream each came from. Never blocks."""
        out: list[Tagged] = []
        get = self._queue.get_nowait
        try:
            while len(out) < POLL_MESSAGES:
                out.append(get())
        except queue.Empty:
            pass
        return out

    def health(self) -> Mapping[str, WorkerHealth]:
        """With several streams, whether each worker's is connected (one stream says it in its
        own events). A stream never says a worker is lost: the agent may come back."""
        if len(self.streams) < 2:
            return {}
        return health_of(self.streams)

    def read_stats(self) -> ReadStats | None:
        return None  # unreadable lines are counted per stream and said in the events

    def send(self, command: Command) -> None:
        """Sends ``command`` to every agent still running (a checkpoint or a stack dump of a
        multi-host job concerns all of them). Raises OSError when none took it."""
        broadcast(command, ((s.label, s.sender.send) for s in self.streams
                            if s.sender is not None and not (s.ended or s.refused)), "no agent is running any more")

    def now(self) -> float | None:
        return None

    def zoom(self, worker: str) -> bool:
        """Switches ``worker``'s stream from summaries to every record, from where it is (the
        stream re-attaches at the byte offset it has accounted for). False when no stream of
        that worker is on summaries (already full, unknown, or ended)."""
        for s in self.streams:
            if s.worker == worker and s.summary and not s.ended:
                self._switch(s)
                return True
        return False

    def full_workers(self) -> frozenset[str]:
        """Workers whose stream carries every record while others carry summaries."""
        if not self.summary:
            return frozenset()
        return frozenset(s.worker for s in self.streams if s.worker is not None and not s.summary)

    def _switch(self, stream: WorkerStream) -> None:
        stream.summary = False
        stream.switching = True
        client = stream.client
        if client is not None:
            client.interrupt_stream()

    def close(self) -> None:
        for s in self.streams:
            s.stop.set()
        for s in self.streams:
            if s.sender is not None:
                s.sender.close()

    # --- the stream threads --------------------------------------------------------------------

    def _put(self, stream: WorkerStream, msg: Message) -> bool:
        """Waits for room (back-pressure); False when the source is closing."""
        while not stream.stop.is_set():
            try:
                self._queue.put((stream.worker, msg), timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _note(self, stream: WorkerStream, level: str, message: str) -> None:
        self._put(stream, Event(t=self._clock(), level=level, source="remote", message=message))  # type: ignore[arg-type]

    def _follow(self, stream: WorkerStream) -> None:
        client = stream.client = self._factory(tcp=stream.address, token=self._token)
        decoder = Decoder()
        delay = self._reconnect_s[0]
        announced_outage = False
        while not stream.stop.is_set():
            got_lines = False
            try:
                stream.connects += 1
                stream.switching = False
                first = True
                for line in client.stream(stream.offset, summary=stream.summary):
                    if stream.stop.is_set():
                        return
                    if not stream.connected:
                        stream.connected = True
                        if announced_outage:
                            self._note(stream, "info", f"reconnected to {stream.label} at byte {stream.offset}")
                            announced_outage = False
                    msg = decoder.decode(line)
                    if first and isinstance(msg, Event) and msg.source == "transport" and msg.level == "error":
                        # The agent refused the handshake (token, version): retrying cannot help.
                        stream.refused = msg.message
                        self._note(stream, "error", f"{stream.label} refused this viewer: {msg.message}")
                        return
                    first = False
                    got_lines = True
                    stream.seen = True
                    stream.malformed = decoder.malformed
                    if type(msg) is HostSummary:
                        stream.offset = msg.offset_bytes  # it accounts for the lines it folded
                        stream.summaries += 1
                    else:
                        stream.offset += len(line) + 1
                    if msg is None:
                        continue
                    if isinstance(msg, Hello) and stream.worker is None:
                        stream.worker = msg.worker
                    if not self._put(stream, msg):
                        return
                    if isinstance(msg, Exit):
                        stream.ended = True
                    elif type(msg) is Topology and msg.worker_index == 0 and stream.summary:
                        # the primary: the run's charts and rates follow its every step
                        self._switch(stream)
                        break
            except AgentUnavailable as e:
                why = str(e)
            except OSError as e:
                why = f"the connection broke ({e.strerror or type(e).__name__})"
            else:
                why = "the agent closed the connection"
            finally:
                stream.connected = False
            if stream.ended or stream.stop.is_set():
                return
            if stream.switching:
                delay = self._reconnect_s[0]
                continue  # re-attach at once in the other mode; not an outage
            if not announced_outage:
                self._note(stream, "warning", f"{stream.label}: {why}; reconnecting from byte {stream.offset}")
                announced_outage = True
            if got_lines:
                delay = self._reconnect_s[0]
            stream.stop.wait(delay)
            delay = min(delay * 2, self._reconnect_s[1])


def make_remote_source(addresses: Sequence[tuple[str, int]], token: str, summary: bool | None = None) -> RemoteSource:
    """The source ``tpuwatch attach HOST:PORT [...] --token-file F [--summaries on|off]`` gives the
    dashboard (``summary`` None: summaries above :data:`SUMMARY_ABOVE_HOSTS` hosts)."""
    return RemoteSource(addresses, token, summary=summary)

"""The agent's socket: viewers attach, catch up, follow live, and send commands.

A viewer's first line is an :class:`~tpuwatch.protocol.Attach`. The agent then streams
``events.jsonl`` to it from the requested byte offset (the recording is the single source of
truth, so catching up and following live are the same loop, and a viewer that stops reading only
falls behind on its own thread: the agent keeps no per-viewer buffer). Lines the viewer sends are
commands; each gets exactly one ``result`` in the recording (and so in every viewer's stream).

Unix socket (0600) in the run directory by default; TCP only when asked (``--listen``), bound to
127.0.0.1 unless another address is named, and only with the run's token.

Hard edges: nothing from the wire is ever unpickled or evaluated (lines go through the typed
``protocol`` decoder); a command line over 64 KiB is skipped whole; malformed lines are counted
(``rejected``, and one summary event per viewer when it leaves); refused handshakes are counted
(``refused``) and reported at most once a second. The first line must arrive within
``HANDSHAKE_TIMEOUT_S`` in all; at most ``MAX_TCP_HANDSHAKES`` TCP connections may be
unauthenticated at once (a new one evicts the oldest), and Unix and TCP viewers have separate
``MAX_VIEWERS`` slots, so remote strangers never lock out local control. The local viewers
together may send ``COMMANDS_PER_S`` commands a second (bursts of ``COMMAND_BURST``), and the TCP
viewers together as many (reconnecting earns no fresh burst); more are skipped and counted, and
a viewer that has had ``MAX_SKIPPED_COMMANDS`` skipped is disconnected.
A viewer that takes nothing for
``TPUWATCH_VIEWER_TIMEOUT_S`` (default 30 s) is dropped, and it can attach again from its offset.
When the agent stops, each live stream is sent the rest of the recording (the ``exit``) first.

A viewer of many hosts asks for the summary stream (``Attach.summary``): the same loop, its lines
folded by :class:`tpuwatch.agent.summary.SummaryBuilder` on this stream's thread, one
``host_summary`` about once a second in place of the step records and samples.
"""

from __future__ import annotations

import hmac
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tpuwatch import protocol
from tpuwatch.agent import clocks
from tpuwatch.agent.summary import SUMMARY_INTERVAL_S, SUMMARY_POLL_S, SummaryBuilder
from tpuwatch.protocol import Attach, Command, Decoder

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent

MAX_VIEWERS = 16  # per listener kind: TCP viewers never take the local (Unix socket) slots
MAX_TCP_HANDSHAKES = 32  # unauthenticated TCP connections at once; a new one evicts the oldest
HANDSHAKE_TIMEOUT_S = 10.0  # for the whole first line, not per recv (a byte a second gains nothing)
COMMANDS_PER_S = 5.0  # all local viewers together, and all TCP viewers together; bursts of COMMAND_BURST
COMMAND_BURST = 20
MAX_SKIPPED_COMMANDS = 100  # a viewer that overruns the limit this often is disconnected
MAX_COMMAND_BYTES = 64 * 1024
CHUNK = 256 * 1024
POLL_S = 0.05  # how often a caught-up stream looks for new lines
CLOSE_FLUSH_S = 10.0  # at exit, how long viewers get to receive the end of the recording (3 s was short under CI load)
REFUSAL_EVENT_INTERVAL_S = 1.0  # a flood of bad handshakes becomes one event a second


def send_timeout_s() -> float:
    """``TPUWATCH_VIEWER_TIMEOUT_S`` (seconds a viewer may take nothing before it is dropped)."""
    from tpuwatch import settings

    return settings.VIEWER_TIMEOUT_S.positive_float()


class Server:
    #: Whether a viewer's ``Attach.summary`` is honoured (an agent from before summaries streams
    #: every line whatever it is asked: tests set this False to be one).
    summaries = True

    def __init__(
        self,
        agent: "Agent",
        unix_path: Path | None,
        tcp: tuple[str, int] | None = None,
        token: str | None = None,
    ) -> None:
        self.agent = agent
        self.unix_path = unix_path
        self.token = token
        self.refused = 0  # handshakes refused (bad token, bad first line)
        self.rejected = 0  # malformed command lines
        self.dropped = 0  # viewers dropped for not reading
        self.viewers = 0
        self.rate_limited = 0  # commands skipped for coming too fast
        # One command budget for all local viewers and one for all TCP viewers: a viewer that
        # reconnects (or several at once) gets no fresh burst; TCP strangers never spend local's.
        self._command_budget = {False: _TokenBucket(COMMANDS_PER_S, COMMAND_BURST),
                                True: _TokenBucket(COMMANDS_PER_S, COMMAND_BURST)}
        self._slots = {False: 0, True: 0}  # viewers per listener kind (TCP: after the token)
        self._handshaking: list[socket.socket] = []  # unauthenticated TCP connections, oldest first
        self.tcp_error = ""
        self.send_timeout_s = send_timeout_s()
        self._lock = threading.Lock()
        self._streams: list[threading.Thread] = []
        # Viewer threads not yet streaming (their attach line on the way): close() waits for them
        # too, or a viewer accepted just before the exit would lose the recording's end.
        self._attaching: set[threading.Thread] = set()
        self._refusals_unreported = 0
        self._last_refusal_event = 0.0
        self._closing = threading.Event()
        self._listeners: list[tuple[socket.socket, bool]] = []
        if unix_path is not None:
            try:
                unix_path.unlink()
            except FileNotFoundError:
                pass
            sock = _high(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            old = os.umask(0o177)
            try:
                sock.bind(str(unix_path))
            finally:
                os.umask(old)
            os.chmod(unix_path, 0o600)
            sock.listen(8)
            self._listeners.append((sock, False))
        self.tcp_address: tuple[str, int] | None = None
        if tcp is not None:
            if not token:
                raise ValueError("a TCP listener needs a token")
            host, port = tcp
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = _high(socket.socket(family, socket.SOCK_STREAM))
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
                sock.listen(8)
            except (OSError, OverflowError) as e:
                # Local control must survive a TCP address that cannot be bound (the launcher
                # checked it, but another process can take the port in between).
                sock.close()
                self.tcp_error = f"cannot listen on {host}:{port} ({getattr(e, 'strerror', None) or e})"
            else:
                self.tcp_address = sock.getsockname()[:2]
                self._listeners.append((sock, True))

    def start(self) -> None:
        if self.tcp_error:
            why = f"{self.tcp_error}: remote viewers cannot attach; local viewers and commands work"
            self.agent.event("error", "transport", why)
            print(f"tpuwatch: {why}", file=sys.stderr)
        for sock, is_tcp in self._listeners:
            threading.Thread(target=self._accept, args=(sock, is_tcp), name="tpuwatch-accept", daemon=True).start()

    def detach_after_fork(self) -> None:
        """In a forked child: closes the child's copies of the listening sockets (the parent's
        stay open) and never removes the socket file, which is the parent's."""
        self.unix_path = None
        self._closing.set()
        self._attaching.clear()  # the parent's viewer threads: none runs in this process
        for sock, _ in self._listeners:
            try:
                sock.close()
            except OSError:
                pass
        self._listeners = []

    def close(self) -> None:
        """Stops accepting viewers; every viewer connected by then gets the rest of the recording
        (up to CLOSE_FLUSH_S): live streams, viewers still sending their attach line, and
        connections the kernel completed that nobody had accepted yet (their ``connect()``
        succeeded: a remote stop's follow-up stream)."""
        self._closing.set()
        for sock, is_tcp in self._listeners:
            try:
                sock.setblocking(False)
                while True:  # the listen backlog, until it is empty (BlockingIOError)
                    conn, addr = sock.accept()
                    conn.setblocking(True)
                    self._take(conn, addr, is_tcp)
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass
        if self.unix_path is not None:
            try:
                self.unix_path.unlink()
            except OSError:
                pass
        deadline = clocks.monotonic() + CLOSE_FLUSH_S
        while clocks.monotonic() < deadline:
            with self._lock:  # each viewer's thread takes itself out (or _take, if it cannot start)
                attaching = bool(self._attaching)
            if not attaching:
                break
            time.sleep(min(POLL_S, max(0.0, deadline - clocks.monotonic())))
        with self._lock:
            streams = list(self._streams)
        for t in streams:
            t.join(timeout=max(0.0, deadline - clocks.monotonic()))

    # --- per viewer -----------------------------------------------------------------------------

    def _accept(self, sock: socket.socket, is_tcp: bool) -> None:
        while not self._closing.is_set():
            try:
                conn, addr = sock.accept()
            except OSError:
                return
            self._take(conn, addr, is_tcp)

    def _take(self, conn: socket.socket, addr: Any, is_tcp: bool) -> None:
        """An accepted connection: registered for close() to wait for, then served by a thread."""
        conn = _high(conn)
        serve = threading.Thread(target=self._serve, args=(conn, is_tcp, addr), name="tpuwatch-viewer", daemon=True)
        evict = None
        with self._lock:
            self._attaching.add(serve)  # from now on close() waits for it (see close)
            if is_tcp:
                self._handshaking.append(conn)
                if len(self._handshaking) > MAX_TCP_HANDSHAKES:
                    evict = self._handshaking.pop(0)
        if evict is not None:
            self._count_refusal("too many unauthenticated TCP connections; closed the oldest", "tcp")
            try:  # its thread wakes from recv and ends
                evict.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            serve.start()
        except RuntimeError:  # no thread to be had (the process is at its limit): this viewer is refused
            with self._lock:
                self._attaching.discard(serve)
                if conn in self._handshaking:
                    self._handshaking.remove(conn)
            conn.close()

    def _count_refusal(self, why: str, peer: str) -> None:
        """Counts a refusal; one warning event a second at most says how many and the last why."""
        now = clocks.monotonic()
        with self._lock:
            self.refused += 1
            total = self.refused
            self._refusals_unreported += 1
            report = now - self._last_refusal_event >= REFUSAL_EVENT_INTERVAL_S
            if report:
                count, self._refusals_unreported = self._refusals_unreported, 0
                self._last_refusal_event = now
        if report:
            self.agent.event("warning", "transport",
                             f"refused viewer {peer}: {why} ({count} refused since the last report, "
                             f"{total} in all)")

    def _refuse(self, conn: socket.socket, why: str, peer: str) -> None:
        self._count_refusal(why, peer)
        try:
            conn.sendall(protocol.encode(protocol.Event(t=clocks.wall(), level="error", source="transport", message=why)))
        except OSError:
            pass

    def _serve(self, conn: socket.socket, is_tcp: bool, addr: Any) -> None:
        peer = f"{addr[0]}:{addr[1]}" if is_tcp and addr else "unix"
        stream: threading.Thread | None = None
        slot = False
        try:
            reader = _LineReader(conn, MAX_COMMAND_BYTES)
            reader.deadline = clocks.monotonic() + HANDSHAKE_TIMEOUT_S
            timed_out = False
            try:
                line = reader.readline()
            except socket.timeout:
                line, timed_out = None, True
            if not self._handshake_done(conn, is_tcp):
                return  # evicted for a newer connection (counted then)
            if timed_out:
                self._refuse(conn, f"no attach line within {HANDSHAKE_TIMEOUT_S:g} s", peer)
                return
            reader.deadline = None
            hello = None
            if line is not None:
                try:
                    hello = protocol.decode(line)
                except protocol.ProtocolError:
                    hello = None
            if not isinstance(hello, Attach):
                self._refuse(conn, "the first line must be an attach message", peer)
                return
            if hello.protocol_version != protocol.PROTOCOL_VERSION:
                self._refuse(conn, f"protocol version {hello.protocol_version} not supported (agent speaks "
                                   f"{protocol.PROTOCOL_VERSION}); use the same tpuwatch version on both sides", peer)
                return
            if is_tcp and not _token_matches(hello.token, self.token):
                self._refuse(conn, "wrong or missing token; pass --token-file with the run's token file", peer)
                return
            with self._lock:
                slot = self._slots[is_tcp] < MAX_VIEWERS
                if slot:
                    self._slots[is_tcp] += 1
                    self.viewers += 1
            if not slot:
                self._refuse(conn, f"{MAX_VIEWERS} {'TCP' if is_tcp else 'local'} viewers are attached already; "
                                   "detach one and try again", peer)
                return
            conn.settimeout(self.send_timeout_s)
            if hello.offset >= 0:
                fold = hello.summary and self.summaries
                stream = threading.Thread(target=self._stream, args=(conn, hello.offset, fold), name="tpuwatch-stream",
                                          daemon=True)
                stream.start()
                with self._lock:
                    self._streams = [t for t in self._streams if t.is_alive()]
                    self._streams.append(stream)
            with self._lock:
                self._attaching.discard(threading.current_thread())
            self._commands(conn, reader, peer, self._command_budget[is_tcp])
        except _TooLong:
            self._refuse(conn, "the first line is too long", peer)
        except OSError:
            pass  # the viewer went away: nothing to report, it can attach again
        finally:
            with self._lock:
                self._attaching.discard(threading.current_thread())
            if stream is not None and stream.is_alive():
                if self._closing.is_set():
                    stream.join(CLOSE_FLUSH_S)  # let it send the end of the recording
                else:
                    try:  # the viewer hung up: wake the stream thread out of a blocked send
                        conn.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    stream.join(CLOSE_FLUSH_S)
            if slot:
                with self._lock:
                    self._slots[is_tcp] -= 1
                    self.viewers -= 1
            self._handshake_done(conn, is_tcp)  # a first line that failed otherwise (too long, reset)
            try:
                conn.close()
            except OSError:
                pass

    def _handshake_done(self, conn: socket.socket, is_tcp: bool) -> bool:
        """Takes ``conn`` off the unauthenticated list; False if it was evicted from it."""
        if not is_tcp:
            return True
        with self._lock:
            try:
                self._handshaking.remove(conn)
            except ValueError:
                return False
        return True

    def _commands(self, conn: socket.socket, reader: "_LineReader", peer: str, bucket: "_TokenBucket") -> None:
        decoder = Decoder()
        rejected = too_long = limited = 0
        last_said = float("-inf")
        # The socket keeps the send timeout (it applies to both directions, and the stream
        # thread's sends need it to drop a viewer that stopped reading): a quiet viewer's reads
        # time out and are simply retried.
        reader.retry_timeouts = lambda: not self._closing.is_set()
        try:
            while not self._closing.is_set():
                try:
                    line = reader.readline()
                except _TooLong:
                    too_long += 1
                    with self._lock:
                        self.rejected += 1
                    continue
                if line is None:
                    return
                if not line.strip():
                    continue
                msg = decoder.decode(line)
                if not isinstance(msg, Command):
                    rejected += 1
                    with self._lock:
                        self.rejected += 1
                    continue
                # A flood must cost neither the training thread (each command a result, a
                # handler call) nor the recording (one result line each): skipped, counted, said
                # once a second, and a viewer that keeps at it is disconnected.
                if not bucket.take():
                    limited += 1
                    with self._lock:
                        self.rate_limited += 1
                    if limited >= MAX_SKIPPED_COMMANDS:
                        self.agent.event("warning", "transport",
                                         f"viewer {peer} sends commands faster than {COMMANDS_PER_S:g}/s (bursts "
                                         f"of {COMMAND_BURST}): disconnected after skipping {limited}; it can attach "
                                         "again")
                        return
                    now = clocks.monotonic()
                    if now - last_said >= REFUSAL_EVENT_INTERVAL_S:
                        last_said = now
                        self.agent.event("warning", "transport",
                                         f"viewer {peer} sends commands faster than {COMMANDS_PER_S:g}/s "
                                         f"(bursts of {COMMAND_BURST}); skipped {limited} so far, without results")
                    continue
                self.agent.submit(msg)
        finally:
            if rejected or too_long:
                why = f"; last error: {decoder.last_error[:200]}" if decoder.last_error else ""
                self.agent.event("warning", "transport",
                                 f"viewer {peer} sent {rejected} malformed and {too_long} over-long "
                                 f"(> {MAX_COMMAND_BYTES} bytes) lines, skipped{why}")

    def _stream(self, conn: socket.socket, offset: int, summary: bool = False) -> None:
        """Sends the recording from ``offset`` on, whole lines only, until the agent stops;
        with ``summary``, folded into summaries (:mod:`tpuwatch.agent.summary`).

        Memory per viewer is one chunk: a viewer that stops reading blocks this thread in
        ``sendall`` (never the training thread) until the send timeout drops it.
        """
        path = self.agent.events_path
        try:
            f = open(path, "rb")
        except OSError:
            return
        with f:
            f.seek(min(offset, os.fstat(f.fileno()).st_size))
            builder = SummaryBuilder(f.tell(), clocks.wall) if summary else None
            next_tick = clocks.monotonic() + SUMMARY_INTERVAL_S
            caught_up = False
            pending = b""
            while True:
                # Read the closing flag before the file, so the last read after it is set sees
                # everything the agent wrote before closing (its final drain happens first).
                closing = self._closing.is_set()
                chunk = f.read(CHUNK)
                out = b""
                if builder is not None:
                    now = clocks.monotonic()
                    # each interval, as soon as a backlog has been read, and at the end
                    if now >= next_tick or not chunk and (not caught_up or closing):
                        caught_up = caught_up or not chunk
                        next_tick = now + SUMMARY_INTERVAL_S
                        out = b"".join(builder.tick())
                if not chunk:
                    if out and not self._send(conn, out):
                        return
                    if closing:
                        return
                    time.sleep(POLL_S if builder is None else SUMMARY_POLL_S)
                    continue
                data = pending + chunk
                cut = data.rfind(b"\n") + 1
                pending = data[cut:]
                if len(pending) > protocol.MAX_LINE_BYTES:
                    if builder is not None:
                        builder.skip(len(pending))  # its bytes still count in the offsets it reports
                    pending = b""  # a runaway line no decoder would take: do not hold it
                if builder is not None:
                    if cut:
                        start = 0
                        parts = [out]
                        while start < cut:
                            nl = data.index(b"\n", start) + 1
                            parts.extend(builder.feed(data[start:nl]))
                            start = nl
                        out = b"".join(parts)
                elif cut:
                    out = data[:cut]
                if out and not self._send(conn, out):
                    return

    def _send(self, conn: socket.socket, data: bytes) -> bool:
        """Sends ``data``; False when the viewer is gone (or was dropped for taking nothing)."""
        try:
            conn.sendall(data)
            return True
        except socket.timeout:
            with self._lock:
                self.dropped += 1
            self.agent.event("warning", "transport",
                             f"dropped a viewer that took nothing for {self.send_timeout_s:g} s; "
                             "it can attach again")
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return False
        except OSError:
            return False


def _token_matches(given: str, expected: str | None) -> bool:
    """Compares in constant time; a token no UTF-8 encoder takes (a lone surrogate, which JSON
    can carry as ``\\udcff``) matches nothing, like any other wrong token."""
    if not expected:
        return False
    try:
        given_bytes = given.encode()
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(given_bytes, expected.encode())


def _high(sock: socket.socket) -> socket.socket:
    """``sock`` on a high, close-on-exec descriptor (agent_api.high_fd): a script that closes a low
    descriptor and opens its own socket or file there never gets the agent's stream."""
    from tpuwatch.agent.agent_api import high_fd

    fd = sock.detach()
    timeout = sock.gettimeout()
    moved = socket.socket(sock.family, sock.type, sock.proto, fileno=high_fd(fd))
    moved.settimeout(timeout)
    return moved


class _TooLong(Exception):
    pass


class _TokenBucket:
    """Shared by the connection threads of one kind of viewer (its own lock)."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.t = clocks.monotonic()
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            now = clocks.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
            self.t = now
            if self.tokens < 1.0:
                return False
            self.tokens -= 1.0
            return True


class _LineReader:
    """Reads newline-terminated lines with a size limit (longer lines are skipped whole)."""

    def __init__(self, conn: socket.socket, limit: int) -> None:
        self.conn = conn
        self.limit = limit
        self.buf = b""
        self.skipping = False
        # Whether a read that timed out should wait again (None: the timeout is an error).
        self.retry_timeouts: "Callable[[], bool] | None" = None
        # A monotonic time by which the whole line must have arrived (the handshake), or None.
        self.deadline: float | None = None

    def readline(self) -> bytes | None:
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line, self.buf = self.buf[:nl], self.buf[nl + 1 :]
                if self.skipping or len(line) > self.limit:
                    self.skipping = False
                    raise _TooLong()
                return line
            if len(self.buf) > self.limit:
                self.buf = b""
                self.skipping = True
            if self.deadline is not None:
                left = self.deadline - clocks.monotonic()
                if left <= 0:
                    raise socket.timeout("line deadline passed")
                self.conn.settimeout(left)
            try:
                data = self.conn.recv(65536)
            except socket.timeout:
                if self.retry_timeouts is not None and self.retry_timeouts():
                    continue
                raise
            if not data:
                return None
            self.buf += data

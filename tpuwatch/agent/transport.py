"""The agent's socket: viewers attach, catch up, follow live, and send commands.

A viewer's first line is an :class:`~tpuwatch.protocol.Attach`. The agent then streams
``events.jsonl`` to it from the requested byte offset (the recording is the single source of
truth, so catching up and following live are the same loop, and a viewer that stops reading only
falls behind on its own thread: the agent keeps no per-viewer buffer). Lines the viewer sends are
commands; each gets exactly one ``result`` in the recording (and so in every viewer's stream).

Unix socket (0600) in the run directory by default; TCP only when asked (``--listen``), bound to
127.0.0.1 unless another address is named, and only with the run's token.
"""

from __future__ import annotations

import hmac
import os
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tpuwatch import protocol
from tpuwatch.protocol import Attach, Command, Decoder

if TYPE_CHECKING:
    from tpuwatch.agent.runtime import Agent

MAX_VIEWERS = 16
HANDSHAKE_TIMEOUT_S = 10.0
SEND_TIMEOUT_S = 30.0  # a viewer that takes nothing for this long is dropped (it can re-attach)
MAX_COMMAND_BYTES = 64 * 1024
CHUNK = 256 * 1024


class Server:
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
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._listeners: list[tuple[socket.socket, bool]] = []
        if unix_path is not None:
            try:
                unix_path.unlink()
            except FileNotFoundError:
                pass
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
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
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(8)
            self.tcp_address = sock.getsockname()[:2]
            self._listeners.append((sock, True))

    def start(self) -> None:
        for sock, is_tcp in self._listeners:
            threading.Thread(target=self._accept, args=(sock, is_tcp), name="tpuwatch-accept", daemon=True).start()

    def close(self) -> None:
        self._closing.set()
        for sock, _ in self._listeners:
            try:
                sock.close()
            except OSError:
                pass
        if self.unix_path is not None:
            try:
                self.unix_path.unlink()
            except OSError:
                pass

    # --- per viewer -----------------------------------------------------------------------------

    def _accept(self, sock: socket.socket, is_tcp: bool) -> None:
        while not self._closing.is_set():
            try:
                conn, addr = sock.accept()
            except OSError:
                return
            with self._lock:
                if self.viewers >= MAX_VIEWERS:
                    self.refused += 1
                    conn.close()
                    continue
                self.viewers += 1
            threading.Thread(target=self._serve, args=(conn, is_tcp, addr), name="tpuwatch-viewer", daemon=True).start()

    def _refuse(self, conn: socket.socket, why: str, peer: str) -> None:
        with self._lock:
            self.refused += 1
        self.agent.event("warning", "transport", f"refused viewer {peer}: {why}")
        try:
            conn.sendall(protocol.encode(protocol.Event(t=time.time(), level="error", source="transport", message=why)))
        except OSError:
            pass

    def _serve(self, conn: socket.socket, is_tcp: bool, addr) -> None:
        peer = f"{addr[0]}:{addr[1]}" if is_tcp and addr else "unix"
        try:
            conn.settimeout(HANDSHAKE_TIMEOUT_S)
            reader = _LineReader(conn, MAX_COMMAND_BYTES)
            line = reader.readline()
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
                self._refuse(conn, f"protocol version {hello.protocol_version} not supported (agent speaks {protocol.PROTOCOL_VERSION}); use the same tpuwatch version on both sides", peer)
                return
            if is_tcp and not (self.token and hmac.compare_digest(hello.token.encode(), self.token.encode())):
                self._refuse(conn, "wrong or missing token; pass --token-file with the run's token file", peer)
                return
            conn.settimeout(SEND_TIMEOUT_S)
            if hello.offset >= 0:
                threading.Thread(target=self._stream, args=(conn, hello.offset), name="tpuwatch-stream", daemon=True).start()
            self._commands(conn, reader)
        except _TooLong:
            self._refuse(conn, "the first line is too long", peer)
        except OSError:
            pass
        finally:
            with self._lock:
                self.viewers -= 1
            try:
                conn.close()
            except OSError:
                pass

    def _commands(self, conn: socket.socket, reader: "_LineReader") -> None:
        decoder = Decoder()
        conn.settimeout(None)
        while not self._closing.is_set():
            try:
                line = reader.readline()
            except _TooLong:
                with self._lock:
                    self.rejected += 1
                continue
            if line is None:
                return
            msg = decoder.decode(line)
            if not isinstance(msg, Command):
                with self._lock:
                    self.rejected += 1
                continue
            self.agent.submit(msg)

    def _stream(self, conn: socket.socket, offset: int) -> None:
        path = self.agent.events_path
        try:
            f = open(path, "rb")
        except OSError:
            return
        with f:
            f.seek(min(offset, os.path.getsize(path)))
            pending = b""
            while not self._closing.is_set():
                chunk = f.read(CHUNK)
                if not chunk:
                    time.sleep(0.05)
                    continue
                data = pending + chunk
                cut = data.rfind(b"\n") + 1
                pending = data[cut:]
                if not cut:
                    continue
                try:
                    conn.sendall(data[:cut])
                except socket.timeout:
                    with self._lock:
                        self.dropped += 1
                    self.agent.event("warning", "transport", "dropped a viewer that stopped reading; it can attach again")
                    try:
                        conn.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                except OSError:
                    return


class _TooLong(Exception):
    pass


class _LineReader:
    """Reads newline-terminated lines with a size limit (longer lines are skipped whole)."""

    def __init__(self, conn: socket.socket, limit: int) -> None:
        self.conn = conn
        self.limit = limit
        self.buf = b""
        self.skipping = False

    def readline(self) -> bytes | None:
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line, self.buf = self.buf[:nl], self.buf[nl + 1 :]
                if self.skipping:
                    self.skipping = False
                    raise _TooLong()
                return line
            if len(self.buf) > self.limit:
                self.buf = b""
                self.skipping = True
            data = self.conn.recv(65536)
            if not data:
                return None
            self.buf += data

"""The viewer's side of the agent socket: send commands, or stream a remote recording.

Local viewers read telemetry from ``events.jsonl`` directly and use the socket only for
commands (``Attach(offset=-1)``); a remote viewer (TCP + token) asks for the stream from an
offset and decodes the lines it receives.
"""

from __future__ import annotations

import socket
import threading
import uuid
from pathlib import Path

from tpuwatch import address, protocol, rundir
from tpuwatch.protocol import Attach, Command

CONNECT_TIMEOUT_S = 5.0


class AgentUnavailable(ConnectionError):
    """The agent cannot be reached: the message says why and what to do."""


def new_command(action: str, **args: object) -> Command:
    plain = {k: v for k, v in args.items() if v is not None}
    return Command(id=uuid.uuid4().hex[:12], action=action, args=plain)  # type: ignore[arg-type]


def read_addresses(refs: list[str]) -> list[tuple[str, int]]:
    """HOST:PORT arguments, where ``@FILE`` stands for the addresses listed in FILE (one a line,
    ``#`` comments). Raises ValueError with a one-line message naming the bad entry."""
    out: list[tuple[str, int]] = []
    for ref in refs:
        if ref.startswith("@"):
            path = Path(ref[1:]).expanduser()
            try:
                text = path.read_text()
            except OSError as e:
                raise ValueError(f"cannot read the host list {path}: {e.strerror or e}") from None
            for n, line in enumerate(text.splitlines(), 1):
                entry = line.split("#", 1)[0].strip()
                if entry:
                    try:
                        out.append(address.parse(entry))
                    except ValueError as e:
                        raise ValueError(f"{path}:{n}: {e}") from None
        else:
            out.append(address.parse(ref))
    if not out:
        raise ValueError("no HOST:PORT given (the host list is empty)")
    return out


class AgentClient:
    """A connection to one agent that sends commands. Thread-safe; reconnects when needed."""

    def __init__(self, unix_path: Path | None = None, tcp: tuple[str, int] | None = None, token: str = "") -> None:
        self.unix_path = unix_path
        self.tcp = tcp
        self.token = token
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._streaming: socket.socket | None = None  # the socket of the current stream()

    @classmethod
    def for_run(cls, run_dir: Path) -> "AgentClient":
        meta = rundir.read_meta(run_dir)
        path = Path(meta["socket"]) if meta.get("socket") else rundir.socket_path(run_dir)
        return cls(unix_path=path)

    def _connect(self, offset: int, summary: bool = False) -> socket.socket:
        try:
            if self.tcp is not None:
                sock = socket.create_connection(self.tcp, timeout=CONNECT_TIMEOUT_S)
            else:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(CONNECT_TIMEOUT_S)
                sock.connect(str(self.unix_path))
        except FileNotFoundError:
            raise AgentUnavailable("the training process is not running (its socket is gone)") from None
        except ConnectionRefusedError:
            raise AgentUnavailable("the training process is not accepting viewers (it has ended?)") from None
        except OSError as e:
            raise AgentUnavailable(f"cannot reach the agent: {e.strerror or e}") from None
        try:
            sock.sendall(protocol.encode(Attach(protocol_version=protocol.PROTOCOL_VERSION, offset=offset,
                                                token=self.token, viewer="tpuwatch", summary=summary)))
        except OSError as e:  # the agent closed at once: it refused us (too many viewers, ...)
            sock.close()
            raise AgentUnavailable(f"the agent closed the connection ({e.strerror or e}); it may have too "
                                   "many viewers, try again") from None
        return sock

    def send(self, cmd: Command) -> None:
        """Sends one command; its result arrives in the recording. Raises AgentUnavailable."""
        data = protocol.encode(cmd)
        with self._lock:
            for attempt in (0, 1):
                if self._sock is None:
                    self._sock = self._connect(offset=-1)
                try:
                    self._sock.sendall(data)
                    return
                except OSError:
                    self.close_locked()
                    if attempt:
                        raise AgentUnavailable("the connection to the agent broke") from None

    def stream(self, offset: int = 0, idle_timeout_s: float | None = None, summary: bool = False):
        """Yields raw lines of the agent's recording from ``offset`` on (remote viewers).

        Each line is whole, without its newline; the byte offset after it is the previous
        offset plus ``len(line) + 1`` (reconnect from there), except after a ``host_summary``
        (asked for with ``summary``), which says the offset itself. Ends when the agent closes the
        connection or :meth:`interrupt_stream` is called; raises ``OSError`` (``socket.timeout``
        after ``idle_timeout_s`` of silence) when it breaks. A line longer than the protocol's
        limit is cut off and skipped.
        """
        sock = self._connect(offset=offset, summary=summary)
        sock.settimeout(idle_timeout_s)
        self._streaming = sock
        buf = b""
        try:
            while True:
                data = sock.recv(1 << 16)
                if not data:
                    return
                buf += data
                *lines, buf = buf.split(b"\n")
                yield from lines
                if len(buf) > protocol.MAX_LINE_BYTES:
                    raise AgentUnavailable(f"the agent sent a line over {protocol.MAX_LINE_BYTES} bytes")
        finally:
            self._streaming = None
            sock.close()

    def interrupt_stream(self) -> None:
        """Ends the current :meth:`stream` (from another thread): it returns as if the agent had
        closed the connection."""
        sock = self._streaming
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close_locked(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()

"""The agent's transport at exit: a viewer whose connection was accepted just before the agent
closed (its attach line still on the way, as a remote stop's follow-up stream is under load) gets
the whole recording, the exit included, before ``close()`` returns. The process ends right after
``close()``: a stream still starting then would die with it, and the viewer would see the
connection close with no exit recorded. Real sockets, a real ``Server`` over a real recording."""

from __future__ import annotations

import secrets
import socket
import threading
import time

from tpuwatch import protocol
from tpuwatch.agent.transport import Server
from tpuwatch.protocol import Attach
from tpuwatch_testing import RecordingAgent


def test_a_viewer_still_attaching_at_close_gets_the_exit_before_close_returns(tmp_path):
    agent = RecordingAgent(tmp_path)
    last = protocol.Exit(t=time.time(), exit_code=130, source="agent")
    agent.events_path.write_bytes(b"".join(protocol.encode(protocol.Event(t=time.time(), level="info", source="test",
                                                                          message=f"line {i}")) for i in range(50))
                                  + protocol.encode(last))
    token = secrets.token_hex(16)
    server = Server(agent, None, ("127.0.0.1", 0), token)
    server.start()
    sock = socket.create_connection(server.tcp_address, timeout=10)
    try:
        deadline = time.monotonic() + 10
        while not server._handshaking:  # accepted: its thread waits for the attach line
            assert time.monotonic() < deadline
            time.sleep(0.01)
        closed = threading.Event()
        closer = threading.Thread(target=lambda: (server.close(), closed.set()), daemon=True)
        closer.start()
        time.sleep(0.3)  # the agent is closing; the viewer's attach line arrives only now
        returned_early = closed.is_set()
        sock.sendall(protocol.encode(Attach(protocol_version=protocol.PROTOCOL_VERSION, offset=0, token=token,
                                            viewer="test")))
        closer.join(10)
        assert not returned_early, "close() returned while an accepted viewer was still attaching"
        sock.setblocking(False)
        got = b""
        try:
            while chunk := sock.recv(1 << 16):
                got += chunk
        except BlockingIOError:
            pass
        assert got.endswith(protocol.encode(last)), got[-300:]
    finally:
        sock.close()


def test_a_viewer_in_the_listen_backlog_at_close_gets_the_exit(tmp_path):
    # The kernel completed the connection (connect() returned, the attach line sent) but nobody
    # had accepted it yet when the agent closed: close() accepts it and sends the recording.
    agent = RecordingAgent(tmp_path)
    last = protocol.Exit(t=time.time(), exit_code=0, source="agent")
    agent.events_path.write_bytes(protocol.encode(protocol.Event(t=time.time(), level="info", source="test",
                                                                 message="line")) + protocol.encode(last))
    token = secrets.token_hex(16)
    server = Server(agent, None, ("127.0.0.1", 0), token)  # not started: no thread accepts
    sock = socket.create_connection(server.tcp_address, timeout=10)
    try:
        sock.sendall(protocol.encode(Attach(protocol_version=protocol.PROTOCOL_VERSION, offset=0, token=token,
                                            viewer="test")))
        server.close()
        got = b""
        while chunk := sock.recv(1 << 16):  # the agent closes the connection after the recording
            got += chunk
        assert got.endswith(protocol.encode(last)), got[-300:]
    finally:
        sock.close()

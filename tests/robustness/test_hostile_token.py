"""A TCP client whose attach line carries a token no UTF-8 encoder accepts:
the agent refuses it, counts the refusal, and writes nothing into the script's output."""

from __future__ import annotations

import json
import socket
import time

import pytest
from robust_agent import start_agent

from tpuwatch import protocol
from tpuwatch.agent.transport import REFUSAL_EVENT_INTERVAL_S

pytestmark = pytest.mark.tf


def test_a_token_with_a_lone_surrogate_is_a_counted_refusal_and_no_traceback(tmp_path):
    stop = tmp_path / "stop"
    agent = start_agent(tmp_path, "--steps", "1000000", "--step-sleep", "0.03", "--stop-file", str(stop),
                        listen="127.0.0.1:0")
    try:
        agent.wait_listening()
        agent.wait_step(1)
        # json.dumps writes the lone surrogate as the escape \udcff, which json.loads turns back
        # into a str the encoder refuses.
        attach = json.dumps({"kind": "attach", "protocol_version": protocol.PROTOCOL_VERSION,
                             "offset": -1, "token": "\udcff"}).encode() + b"\n"
        replies = []
        for _ in range(3):
            with socket.create_connection(agent.tcp, timeout=10) as conn:
                conn.sendall(attach)
                data = b""
                while chunk := conn.recv(4096):
                    data += chunk
            replies.append(data)
            time.sleep(REFUSAL_EVENT_INTERVAL_S + 0.1)  # each refusal is then reported with the count
        for data in replies:
            refusal = protocol.decode(data.splitlines()[0])
            assert isinstance(refusal, protocol.Event) and refusal.level == "error", data
            assert "wrong or missing token" in refusal.message
        refused = agent.wait_for_message(
            lambda m: isinstance(m, protocol.Event) and "refused viewer" in m.message)
        assert "wrong or missing token" in refused.message
        stop.touch()
        assert agent.wait(timeout=180) == 0, agent.output()
    finally:
        agent.kill()
    output = agent.output()
    assert "Traceback" not in output and "UnicodeEncodeError" not in output, output
    refusals = [m.message for m in agent.messages() if isinstance(m, protocol.Event) and "refused viewer" in m.message]
    assert refusals[-1].endswith("3 in all)"), refusals

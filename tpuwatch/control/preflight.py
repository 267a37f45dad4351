"""Checks before a viewer opens: is there anything it could show?

A dashboard over a wrong token, a closed port or a file that is not a recording used to look like a
live run waiting for its first message (and offered to stop it). These checks let ``tpuwatch
attach``/``replay`` say what is wrong in one line and exit non-zero instead, when nothing at all
can be shown; when some of several agents answer, the dashboard opens and its header names the
others' problems.
"""

from __future__ import annotations

import socket
from typing import Callable

from tpuwatch import protocol
from tpuwatch.control.client import AgentClient, AgentUnavailable

#: Seconds to wait for an agent's first line (its Hello, or its refusal).
FIRST_LINE_S = 5.0


def endpoint_problem(address: tuple[str, int], token: str, *,
                     client_factory: Callable[..., AgentClient] = AgentClient,
                     timeout_s: float = FIRST_LINE_S) -> str:
    """Connects to an agent started with ``--listen`` and reads its first line: "" when it is a
    message of the run, else one line saying what is wrong (refused token, closed port, ...)."""
    label = "%s:%d" % address
    client = client_factory(tcp=address, token=token)
    try:
        for line in client.stream(0, idle_timeout_s=timeout_s):
            msg = protocol.Decoder().decode(line)
            if isinstance(msg, protocol.Event) and msg.source == "transport" and msg.level == "error":
                return f"{label} refused this viewer: {msg.message}"
            if msg is None:
                return f"{label} does not speak the tpuwatch protocol (is it a tpuwatch agent's --listen port?)"
            return ""
        return f"{label} closed the connection without a word (wrong token, or not a tpuwatch agent?)"
    except AgentUnavailable as e:
        return f"{label}: {e}"
    except socket.timeout:
        return f"{label} sent nothing for {timeout_s:.0f} s (is it a tpuwatch agent's --listen port?)"
    except OSError as e:
        return f"{label}: {e.strerror or e}"
    finally:
        client.close()

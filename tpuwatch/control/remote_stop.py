"""Stopping training from a ``tpuwatch attach HOST:PORT`` viewer: the ``stop`` command.

A remote viewer cannot signal a process on another host; it asks each agent (with the run's
token) to stop, then follows each recording from where the dashboard left it until the agent's
answer and the run's exit arrive, printing both. Bounded: the grace periods of a local stop plus
a margin.
"""

from __future__ import annotations

import socket
import time
from typing import Callable, Sequence

from tpuwatch import protocol
from tpuwatch.control.client import AgentClient, AgentUnavailable, new_command
from tpuwatch.monitor.runs import ended_state

#: Longest wait for an agent's exit after asking it to stop (its own grace periods: 15 + 10 s).
WAIT_S = 40.0
#: Exit status of ``tpuwatch attach`` when the stop could not be asked for or was refused.
EXIT_NOT_STOPPED = 1


def stop_remote(
    streams: Sequence[tuple[tuple[str, int], int]],
    token: str,
    *,
    report: Callable[[str], None],
    wait_s: float = WAIT_S,
    client_factory: Callable[..., AgentClient] = AgentClient,
) -> int:
    """Asks every agent in ``streams`` ((host, port), recording offset already seen) to stop and
    waits for their exits. Returns the first non-zero exit code, or :data:`EXIT_NOT_STOPPED`."""
    pending: list[tuple[tuple[str, int], int, str, AgentClient]] = []
    failed = False
    for address, offset in streams:
        label = "%s:%d" % address
        client = client_factory(tcp=address, token=token)
        cmd = new_command("stop")
        try:
            client.send(cmd)
        except AgentUnavailable as e:
            report(f"{label}: cannot ask the agent to stop: {e}")
            failed = True
            continue
        finally:
            client.close()
        report(f"{label}: asked the agent to stop (SIGINT, then SIGTERM, then SIGKILL); waiting up to {wait_s:.0f} s")
        pending.append((address, offset, cmd.id, client_factory(tcp=address, token=token)))
    codes: list[int] = []
    deadline = time.monotonic() + wait_s
    for address, offset, cmd_id, client in pending:
        label = "%s:%d" % address
        outcome = _follow(client, offset, cmd_id, deadline)
        if isinstance(outcome, protocol.Exit):
            codes.append(outcome.exit_code)
            report(f"{label}: training {ended_state(outcome.exit_code, True)} (exit code {outcome.exit_code})")
        else:
            failed = True
            report(f"{label}: not stopped: {outcome}")
    code = next((c for c in codes if c != 0), codes[0] if codes else 0)
    return EXIT_NOT_STOPPED if failed and code == 0 else code


def _follow(client: AgentClient, offset: int, cmd_id: str, deadline: float) -> protocol.Exit | str:
    """Reads the recording from ``offset`` until the run's exit (returned) or a refusal of the
    stop command or the deadline (a one-line reason)."""
    while time.monotonic() < deadline:
        try:
            for line in client.stream(offset, idle_timeout_s=1.0):
                offset += len(line) + 1
                msg = protocol.decode(line)
                if isinstance(msg, protocol.Exit):
                    return msg
                if isinstance(msg, protocol.Result) and msg.id == cmd_id and not msg.ok:
                    return f"the agent refused: {msg.message}"
                if time.monotonic() >= deadline:
                    break
            else:
                return "the agent closed the connection without recording an exit"
        except socket.timeout:
            continue  # silence: check the deadline, then read on from the same offset
        except (AgentUnavailable, OSError) as e:
            return f"the connection broke ({e})"
        finally:
            client.close()
    return f"no exit recorded within {WAIT_S:.0f} s; the training may still be running"

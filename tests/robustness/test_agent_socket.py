"""The agent's socket under abuse, with real training running behind it: thousands of malformed,
truncated, oversized and random lines (hypothesis), TCP without or with a wrong token, a viewer
that stops reading, file modes, and a checkpoint destination outside the allowed roots."""

from __future__ import annotations

import json
import re
import socket
import stat
import time
from collections import Counter

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from robust_agent import start_agent
from robust_terminal import Tmux, have_tmux, tpuwatch_argv

from tpuwatch import protocol
from tpuwatch.agent.transport import MAX_COMMAND_BYTES
from tpuwatch.control.client import AgentClient, new_command
from tpuwatch.protocol import Attach, Command, Decoder

pytestmark = pytest.mark.tf

ATTACH_CMDS = protocol.encode(Attach(protocol_version=protocol.PROTOCOL_VERSION, offset=-1))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
# Objects shaped like messages: right or wrong kinds, fields of any type (some are valid commands).
message_like = st.fixed_dictionaries(
    {"kind": st.sampled_from(["command", "attach", "step", "result", "hello", "nope", ""])},
    optional={"id": json_values, "action": st.text(max_size=12).map(lambda s: "fuzz-" + s) | json_values,
              "args": json_values, "protocol_version": json_values, "offset": json_values, "token": json_values},
)
small_lines = st.one_of(
    st.binary(min_size=1, max_size=200).map(lambda b: b"x" + b.replace(b"\n", b" ")),  # random bytes
    json_values.map(lambda v: json.dumps(v).encode()),  # valid JSON, not a message
    message_like.map(lambda v: json.dumps(v).encode()),  # message-shaped
    message_like.map(lambda v: json.dumps(v).encode()[: max(1, len(json.dumps(v)) // 2)]),  # cut JSON
    st.builds(lambda i, a, v: protocol.encode(Command(id=i, action="fuzz-" + a, args={"x": v}))[:-1],
              st.text(max_size=12), st.text(max_size=12), st.integers() | st.text(max_size=8)),  # valid
)
# Around the 64 KiB command limit, and far over it; one line in 16 (they cost bandwidth).
oversized = st.one_of(st.integers(-64, 64), st.integers(64, 2 * MAX_COMMAND_BYTES)).map(
    lambda n: b"{" + b"a" * (MAX_COMMAND_BYTES + n))
lines = st.integers(0, 15).flatmap(lambda k: oversized if k == 0 else small_lines)
batches = st.tuples(st.lists(lines, min_size=12, max_size=16), st.booleans(), st.randoms(use_true_random=False))


def _variants(line: bytes, rng) -> list[bytes]:
    """The line, cut short, with a byte flipped, and with junk after it (four messages from one
    generated line: hypothesis draws ~2,700 lines, the agent gets ~11,000)."""
    flipped = bytearray(line)
    i = rng.randrange(len(flipped))
    flipped[i] = (flipped[i] + rng.randrange(1, 255)) % 256
    junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
    out = [line, line[: max(1, len(line) // 2)], bytes(flipped), line + junk]
    return [v.replace(b"\n", b" ") for v in out]


def _expected(line: bytes) -> str:
    """What the agent must make of a line it reads whole: 'command', 'skip' (blank) or 'reject'."""
    if len(line) > MAX_COMMAND_BYTES:
        return "reject"
    if not line.strip():
        return "skip"
    return "command" if isinstance(Decoder().decode(line), Command) else "reject"


def _rejects_reported(messages) -> int:
    total = 0
    for m in messages:
        if isinstance(m, protocol.Event) and m.source == "transport":
            found = re.search(r"sent (\d+) malformed and (\d+) over-long", m.message)
            if found:
                total += int(found.group(1)) + int(found.group(2))
    return total


def test_ten_thousand_bad_lines_and_bad_handshakes_leave_training_unaffected(tmp_path):
    stop = tmp_path / "stop"  # training goes on until the fuzzing is over, however long that takes
    agent = start_agent(tmp_path, "--steps", "1000000", "--step-sleep", "0.02", "--stop-file", str(stop),
                        listen="127.0.0.1:0")
    sent = {"lines": 0, "command": 0, "reject": 0, "bad_handshakes": 0}
    try:
        agent.wait_listening()
        agent.wait_step(1)
        unix_path = agent.meta["socket"]
        commands_sent: Counter[tuple[str, str]] = Counter()

        @settings(max_examples=240, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(batches)
        def fuzz(batch):
            generated, truncate_last, rng = batch
            body = [v for line in generated for v in _variants(line, rng)]
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(unix_path)
            with conn:
                conn.sendall(ATTACH_CMDS)
                for i, line in enumerate(body):
                    last_cut = truncate_last and i == len(body) - 1
                    conn.sendall(line if last_cut else line + b"\n")
                    sent["lines"] += 1
                    if last_cut:
                        continue  # a truncated line never ends: not a message, not counted
                    verdict = _expected(line)
                    if verdict == "command":
                        cmd = protocol.decode(line)
                        commands_sent[(cmd.id, cmd.action)] += 1
                    if verdict != "skip":
                        sent[verdict] += 1
            # Bad handshakes too: random first lines on the Unix socket, no/wrong token on TCP.
            first = body[0][:1000]
            if not isinstance(Decoder().decode(first), Attach):
                with socket.create_connection(agent.tcp, timeout=10) as tcp:
                    tcp.sendall(first + b"\n")
                    tcp.recv(4096)
                sent["bad_handshakes"] += 1

        fuzz()
        assert sent["lines"] >= 10_000, sent
        assert agent.proc.poll() is None, "training ended before the fuzzing did: the test proves less"

        # The agent still answers, and training was not disturbed. The fuzz's connections may
        # still hold unread commands that take the viewers' shared budget as it refills (5 a
        # second): a command of ours can be skipped for a while, as a user's key press would be
        # during a flood, so it is sent again every 2 s, as the user would press the key again.
        ids: set[str] = set()
        ok = None
        for _ in range(30):
            cmd = new_command("stack_dump")
            ids.add(cmd.id)
            agent.client().send(cmd)
            try:
                ok = agent.wait_for_message(lambda m: isinstance(m, protocol.Result) and m.id in ids, timeout=2.0)
                break
            except AssertionError:
                continue
        assert ok is not None, "no stack dump of 30, one every 2 s, got a result"
        assert ok.ok, ok.message
        time.sleep(1.1)  # past the refusal report interval: the next refusal reports the total
        with socket.create_connection(agent.tcp, timeout=10) as tcp:
            tcp.sendall(b"not an attach\n")
            tcp.recv(4096)
        sent["bad_handshakes"] += 1
        stop.touch()
        assert agent.wait(timeout=240) == 0, agent.output()
    finally:
        agent.kill()

    messages = agent.messages()
    steps = [m.step for m in messages if isinstance(m, protocol.Step)]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) > 10
    assert [m.exit_code for m in messages if isinstance(m, protocol.Exit)] == [0]
    # Every reject counted, and reported once per viewer when it left.
    assert _rejects_reported(messages) == sent["reject"], sent
    # A well-formed command got one result (unknown actions are refused by name), never two; the
    # viewers' one command budget (5 a second, bursts of 20, however often they reconnect) skips
    # the rest without a result.
    got = Counter((m.id, m.action) for m in messages if isinstance(m, protocol.Result) and (m.id, m.action) in commands_sent)
    assert got and all(got[key] <= n for key, n in commands_sent.items()), sent
    assert sum(got.values()) < sent["command"], sent  # the fuzz outruns the budget: some were skipped
    assert all(not m.ok and m.message.startswith("unknown action") for m in messages
               if isinstance(m, protocol.Result) and (m.id, m.action) in commands_sent)
    refusals = [m.message for m in messages if isinstance(m, protocol.Event) and "refused viewer" in m.message]
    assert refusals and refusals[-1].endswith(f"{sent['bad_handshakes']} in all)"), (refusals[-3:], sent)


@pytest.mark.skipif(not have_tmux(), reason="needs tmux (apt-get install tmux)")
def test_tcp_needs_the_token_and_files_are_private(tmp_path):
    stop = tmp_path / "stop"
    agent = start_agent(tmp_path, "--steps", "1000000", "--step-sleep", "0.03", "--stop-file", str(stop),
                        listen="127.0.0.1:0")
    tmux = Tmux(tmp_path)
    try:
        agent.wait_listening()
        agent.wait_step(1)
        run_dir = agent.run_dir
        assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE((run_dir / "agent.sock").stat().st_mode) == 0o600
        assert stat.S_IMODE((run_dir / "token").stat().st_mode) == 0o600
        host, _ = agent.tcp
        assert host == "127.0.0.1"  # loopback unless the user names another address

        for token in ("", "wrong-" + agent.token[6:], agent.token + "x"):
            lines = list(AgentClient(tcp=agent.tcp, token=token).stream(0, idle_timeout_s=10))
            assert len(lines) == 1, lines  # one refusal line, then the agent hangs up
            refusal = protocol.decode(lines[0])
            assert isinstance(refusal, protocol.Event) and refusal.level == "error"
            assert "wrong or missing token" in refusal.message
        # A refused viewer's commands never reach the agent.
        sneaky = socket.create_connection(agent.tcp, timeout=10)
        sneaky.sendall(protocol.encode(Attach(protocol_version=protocol.PROTOCOL_VERSION, offset=-1, token="nope"))
                       + protocol.encode(new_command("stack_dump")))
        sneaky.recv(4096)
        sneaky.close()

        good = AgentClient(tcp=agent.tcp, token=agent.token).stream(0, idle_timeout_s=30)
        first = protocol.decode(next(good))
        assert isinstance(first, protocol.Hello)
        good.close()

        # `tpuwatch attach HOST:PORT --token-file F` in a real terminal: live, then the end.
        host, port = agent.tcp
        tmux.start("attach", tpuwatch_argv("attach", f"{host}:{port}", "--token-file", str(agent.run_dir / "token")))
        tmux.wait_for("attach", "RUNNING", timeout=60)
        stop.touch()
        tmux.wait_for("attach", "FINISHED", timeout=120)
        tmux.keys("attach", "q")
        assert tmux.dead_status("attach", timeout=20) == 0
        assert agent.wait(timeout=180) == 0, agent.output()
    finally:
        tmux.close()
        agent.kill()
    messages = agent.messages()
    assert not [m for m in messages if isinstance(m, protocol.StackDump)]
    refusals = [m.message for m in messages if isinstance(m, protocol.Event) and "refused viewer" in m.message]
    assert refusals and "wrong or missing token" in refusals[0]


def test_a_viewer_that_stops_reading_does_not_hold_training_or_memory(tmp_path):
    # ~12 MB of recording in a few seconds (tpuwatch.step marks), eight viewers that never read.
    api_steps = 50_000
    agent = start_agent(tmp_path, "--steps", "30", "--api-steps", str(api_steps), "--linger", "4",
                        env={"TPUWATCH_VIEWER_TIMEOUT_S": "2"})
    stuck = []
    try:
        agent.wait_listening()
        agent.wait_step(1)
        proc = psutil.Process(agent.proc.pid)
        rss_before = proc.memory_info().rss
        for _ in range(8):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            conn.connect(agent.meta["socket"])
            conn.sendall(protocol.encode(Attach(protocol_version=protocol.PROTOCOL_VERSION, offset=0)))
            stuck.append(conn)  # ... and never recv()
        rss_peak = rss_before
        while agent.proc.poll() is None:
            try:
                rss_peak = max(rss_peak, proc.memory_info().rss)
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
        assert agent.wait(timeout=180) == 0, agent.output()
    finally:
        for conn in stuck:
            conn.close()
        agent.kill()
    messages = agent.messages()
    steps = [m for m in messages if isinstance(m, protocol.Step)]
    assert len(steps) == 30 + api_steps
    size = (agent.run_dir / "events.jsonl").stat().st_size
    assert size > 8 << 20
    # No per-viewer buffering: 8 stuck viewers x the whole recording would be ~100 MB.
    assert rss_peak - rss_before < 40 << 20, (rss_peak - rss_before, size)
    dropped = [m for m in messages if isinstance(m, protocol.Event) and "dropped a viewer" in m.message]
    assert len(dropped) == 8, [m.message for m in messages if isinstance(m, protocol.Event)]


def test_checkpoint_destination_outside_the_allowed_roots_is_refused(tmp_path):
    agent = start_agent(tmp_path, "--steps", "400", "--step-sleep", "0.02")
    try:
        agent.wait_listening()
        agent.wait_step(1)
        cmd = new_command("checkpoint", dir="/etc/tpuwatch-should-not-write")
        agent.client().send(cmd)
        result = agent.wait_for_message(lambda m: isinstance(m, protocol.Result) and m.id == cmd.id)
        agent.kill()
    finally:
        agent.kill()
    assert not result.ok
    assert "outside the places this run may write to" in result.message, result.message
    assert "--allow-dest" in result.message
    assert not (tmp_path / "etc").exists()


def test_remote_source_resynchronises_after_the_agent_drops_it(tmp_path):
    """A dashboard that falls far behind: the bounded queue fills, TCP pushes back, the agent drops
    the connection, and the source reconnects from its last whole line: every step exactly once."""
    from tpuwatch.sources.remote_source import RemoteSource

    api_steps = 80_000  # ~20 MB: more than loopback TCP buffers hold
    # The agent serves the recording only while it lives: linger long enough for a reconnected
    # viewer to catch up on ~20 MB on a loaded CI box (3 s lost the tail there once).
    agent = start_agent(tmp_path, "--steps", "10", "--api-steps", str(api_steps), "--linger", "20",
                        listen="127.0.0.1:0", env={"TPUWATCH_VIEWER_TIMEOUT_S": "1"})
    source = None
    try:
        agent.wait_listening()
        source = RemoteSource([agent.tcp], agent.token, queue_messages=2000, reconnect_s=(0.1, 0.5))
        # Take nothing until the agent has given up on us.
        agent.wait_for_message(lambda m: isinstance(m, protocol.Event) and "dropped a viewer" in m.message,
                               timeout=120)
        got = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(isinstance(m, protocol.Exit) for _, m in got[-50:]):
            got += source.poll_tagged()
            time.sleep(0.01)
        assert agent.wait(timeout=60) == 0, agent.output()
    finally:
        if source is not None:
            source.close()
        agent.kill()
    steps = [m.step for _, m in got if isinstance(m, protocol.Step)]
    assert steps == list(range(1, 10 + api_steps + 1))
    hello = next(m for _, m in got if isinstance(m, protocol.Hello))
    assert {w for w, m in got if not isinstance(m, protocol.Hello) and w is not None} == {hello.worker}
    notes = [m.message for _, m in got if isinstance(m, protocol.Event) and m.source == "remote"]
    assert any("reconnecting from byte" in n for n in notes), notes
    assert any("reconnected" in n for n in notes), notes
    stream = source.streams[0]
    assert stream.connects >= 2 and stream.ended and stream.malformed == 0
    assert stream.offset == (agent.run_dir / "events.jsonl").stat().st_size

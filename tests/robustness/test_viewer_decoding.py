"""The viewer's side of bad input: the protocol decoder and the recording reader take random,
malformed, cut and oversized lines without raising, count what they skip, and keep every good
line; a recording cut mid-line still replays and reports, saying the tail was cut."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuwatch import protocol
from tpuwatch.monitor.recording import RecordingReader
from tpuwatch.protocol import Decoder, Step
from tpuwatch_testing import ROOT, child_env

DATA = ROOT / "tests" / "data"
GOOD = [
    protocol.encode(Step(step=i, t=1000.0 + i, step_time_s=0.05, input_wait_s=0.001, loss=1.0 / i,
                         replica_losses=(1.0 / i,) * 4, examples=64)).rstrip(b"\n")
    for i in range(1, 6)
]

small_junk = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=200).map(str.encode),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                 lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                 max_leaves=10).map(lambda v: json.dumps(v).encode()),
    st.sampled_from(GOOD).map(lambda g: g[: len(g) // 2]),  # a good line cut short
    st.sampled_from(GOOD).map(lambda g: g.replace(b'"step":', b'"step":"x",', 1)),  # wrong type
    st.sampled_from(GOOD).map(lambda g: g.replace(b'"kind":"step"', b'"kind":"future_kind"')),  # unknown kind
    st.integers(1, 5000).map(lambda depth: b"[" * depth + b"]" * depth),  # nested deep
)
# Lines over the protocol's 1 MiB limit, one in 32 (they cost time to build and read).
huge = st.integers(-2, 2).map(lambda n: b'{"kind":"event","message":"' + b"x" * (protocol.MAX_LINE_BYTES + n) + b'"}')
junk = st.integers(0, 31).flatmap(lambda k: huge if k == 0 else small_junk)
lines_batches = st.lists(junk, min_size=20, max_size=30)


def _clean(line: bytes) -> bytes:
    return line.replace(b"\n", b" ")


def test_decoder_takes_anything_and_counts_it():
    total = [0]

    @settings(max_examples=500, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(lines_batches)
    def check(batch):
        dec = Decoder()
        decoded = 0
        for line in batch:
            line = _clean(line)
            msg = dec.decode(line)  # never raises
            total[0] += 1
            if msg is not None:
                decoded += 1
                assert isinstance(msg, protocol.MESSAGE_TYPES)
                protocol.encode(msg)  # whatever it accepted, it can write back
        assert decoded + dec.malformed + dec.unknown == len(batch)

    check()
    assert total[0] >= 10_000


def test_recording_reader_keeps_every_good_line_among_junk_and_cut_writes(tmp_path):
    total = [0]
    counter = [0]

    @settings(max_examples=450, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(lines_batches, st.randoms(use_true_random=False), st.booleans())
    def check(batch, rng: random.Random, cut_tail: bool):
        counter[0] += 1
        path = tmp_path / f"events-{counter[0]}.jsonl"
        body = []
        for line in batch:
            body.append(_clean(line))
            body.append(rng.choice(GOOD))
        data = b"\n".join(body) + b"\n"
        if cut_tail:
            data += GOOD[0][:20]
        total[0] += len(body)
        reader = RecordingReader(path, max_bytes_per_read=rng.choice([64, 4096, 1 << 20]))
        got = []
        with open(path, "wb") as f:
            pos = 0
            while pos < len(data):  # the agent's writes land in pieces; the reader polls between
                n = rng.randrange(1, 50_000)
                f.write(data[pos:pos + n])
                f.flush()
                pos += n
                got += reader.read_new()
        while True:
            more = reader.read_new()
            if not more:
                break
            got += more
        got += reader.finish()
        steps = [m for m in got if isinstance(m, Step)]
        assert len(steps) >= len(batch)  # every good line survives its junk neighbours
        stats = reader.stats
        assert stats.truncated_tail == cut_tail
        if cut_tail:
            assert stats.dropped_bytes >= 20
        path.unlink()

    check()
    assert total[0] >= 10_000


def _truncated_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "cut-run"
    run_dir.mkdir()
    data = (DATA / "healthy_4replica.jsonl").read_bytes()
    lines = data.splitlines(keepends=True)
    # Drop the exit, and cut the last step line in the middle: the agent died mid-write.
    body = b"".join(lines[:-3]) + lines[-3][: len(lines[-3]) // 2]
    (run_dir / "events.jsonl").write_bytes(body)
    return run_dir


def test_recording_cut_mid_line_still_reports_and_says_so(tmp_path):
    run_dir = _truncated_run(tmp_path)
    text = subprocess.run([sys.executable, "-m", "tpuwatch", "report", str(run_dir)], capture_output=True,
                          text=True, env=child_env(), timeout=60)
    assert text.returncode == 0, text.stderr
    assert "last line cut" in text.stdout, text.stdout
    js = subprocess.run([sys.executable, "-m", "tpuwatch", "report", "--format", "json", str(run_dir)],
                        capture_output=True, text=True, env=child_env(), timeout=60)
    assert js.returncode == 0, js.stderr
    report = json.loads(js.stdout)
    flat = json.dumps(report)
    assert '"truncated_tail": true' in flat


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")
def test_recording_cut_mid_line_still_replays(tmp_path):
    from robust_terminal import Tmux, tpuwatch_argv

    run_dir = _truncated_run(tmp_path)
    tmux = Tmux(tmp_path)
    try:
        tmux.start("replay", tpuwatch_argv("replay", str(run_dir), "--speed", "256"))
        tmux.wait_for("replay", "REPLAY", timeout=30)
        tmux.keys("replay", "End")
        screen = tmux.wait_for("replay", "step 299", timeout=30)  # the last whole step line is 299
        assert "Traceback" not in screen
        tmux.keys("replay", "q")
        assert tmux.dead_status("replay", timeout=20) == 0
    finally:
        tmux.close()

"""A recording whose times are not finite (``Infinity``, ``1e400``, ``-Infinity``, ``NaN``, a
timestamp of ``Infinity``, a time too large to add up): every reader skips that line and counts
it, as any malformed line; nothing overflows. Before: ``report`` (every format), ``compare`` and
``attach`` died with OverflowError or TypeError, and a dashboard attached to an agent sending
such a step froze."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tpuwatch import protocol
from tpuwatch_testing import child_env

CRASHED = Path(__file__).resolve().parents[1] / "data" / "crashed.jsonl"

# What the attack wrote into step 2's line, as raw JSON text.
HOSTILE = {
    "step_time_s Infinity": ('"step_time_s":0.047828', '"step_time_s":Infinity'),
    "step_time_s 1e400": ('"step_time_s":0.047828', '"step_time_s":1e400'),
    "step_time_s -Infinity": ('"step_time_s":0.047828', '"step_time_s":"-Infinity"'),
    "t Infinity": ('"t":1750000002.596518', '"t":"Infinity"'),
    "input_wait_s NaN": ('"input_wait_s":0.001435', '"input_wait_s":"NaN"'),
    "step_time_s 1e308": ('"step_time_s":0.047828', '"step_time_s":1e308'),
}


def _recording(tmp_path: Path, what: str) -> Path:
    old, new = HOSTILE[what]
    lines = CRASHED.read_text().splitlines()
    hostile = [line.replace(old, new) if '"step":2,' in line else line for line in lines]
    assert hostile != lines
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text("\n".join(hostile) + "\n")
    return run_dir


def _tpuwatch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpuwatch", *args], capture_output=True, text=True, timeout=120,
                          env=child_env(TPUWATCH_HOME=str(tmp_path / "home")))


@pytest.mark.parametrize("what", list(HOSTILE))
def test_report_compare_and_attach_skip_a_step_with_a_time_that_is_not_finite(tmp_path, what):
    run_dir = _recording(tmp_path, what)
    for fmt in ("text", "markdown", "json"):
        proc = _tpuwatch(tmp_path, "report", "--format", fmt, str(run_dir))
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (fmt, proc.stderr)
        if fmt == "text":
            assert "1 malformed lines" in proc.stdout and "steps           150 of 150" in proc.stdout
        if fmt == "json":
            json.loads(proc.stdout)
    other = tmp_path / "other"
    other.mkdir()
    (other / "events.jsonl").write_bytes(CRASHED.read_bytes())
    for order in ((run_dir, other), (other, run_dir)):
        proc = _tpuwatch(tmp_path, "compare", *map(str, order))
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    proc = _tpuwatch(tmp_path, "attach", str(run_dir))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr  # the run's own exit code


@pytest.mark.parametrize("what", list(HOSTILE))
def test_the_decoders_reject_the_line(what):
    """The socket's decoder and the recording's fast path alike (a viewer attached to an agent)."""
    old, new = HOSTILE[what]
    line = next(raw for raw in CRASHED.read_text().splitlines() if '"step":2,' in raw).replace(old, new).encode()
    assert protocol.decode_step_line(line) is None
    decoder = protocol.Decoder()
    assert decoder.decode(line) is None and decoder.malformed == 1, decoder
    assert "is not a time in seconds" in decoder.last_error


def test_loss_may_still_be_not_finite():
    line = next(raw for raw in CRASHED.read_text().splitlines() if '"step":2,' in raw)
    nan_loss = json.loads(line) | {"loss": "NaN"}
    step = protocol.decode(json.dumps(nan_loss))
    assert isinstance(step, protocol.Step) and step.loss != step.loss

"""Recording builders for the monitor tests (on top of tests/data/make_recordings.py)."""

from __future__ import annotations

import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"
if str(DATA) not in sys.path:
    sys.path.insert(0, str(DATA))

import make_recordings as mr  # noqa: E402  (after the path insert above)

from tpuwatch import protocol  # noqa: E402
from tpuwatch.protocol import Message, Step  # noqa: E402


def write_run(run_dir: Path, messages: list[Message], *, cut_last_bytes: int = 0,
              meta: dict | None = None) -> Path:
    """A run directory holding ``messages`` as its events.jsonl (and run.json if ``meta``)."""
    from tpuwatch import rundir

    run_dir.mkdir(parents=True, exist_ok=True)
    mr.write(run_dir / rundir.EVENTS, messages, cut_last_bytes=cut_last_bytes)
    if meta is not None:
        rundir.write_meta(run_dir, meta)
    return run_dir


def step(n: int, t: float, step_time_s: float = 0.05, wait: float | None = 0.001,
         losses: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0), examples: int | None = 64) -> Step:
    """A step record with the given numbers (loss = mean of ``losses``)."""
    loss = sum(losses) / len(losses) if losses else None
    return Step(step=n, t=t, step_time_s=step_time_s, input_wait_s=wait, loss=loss,
                replica_losses=losses, examples=examples, function="train_step")


def encode_all(messages: list[Message]) -> bytes:
    return b"".join(protocol.encode(m) for m in messages)


__all__ = ["mr", "write_run", "step", "encode_all", "DATA"]

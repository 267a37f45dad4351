"""The explicit step API, for training loops the agent's patches cannot understand.

Costs nothing without the agent: outside ``tpuwatch run`` the context manager only yields a
scratch object. Never imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from typing import Iterator, Sequence


@dataclass
class StepInfo:
    """Filled in by the loop inside ``with tpuwatch.step() as s:`` (all optional)."""

    loss: float | None = None
    replica_losses: Sequence[float] = field(default_factory=tuple)
    examples: int | None = None


@contextlib.contextmanager
def step(examples: int | None = None) -> Iterator[StepInfo]:
    """Marks one training step. tf.functions called inside are not counted again."""
    info = StepInfo(examples=examples)
    runtime = sys.modules.get("tpuwatch.agent.runtime")
    agent = runtime.current() if runtime is not None else None
    if agent is None:
        yield info
        return
    # The step probe is made when the script imports TensorFlow; a loop that never does gets it here.
    probe = agent.manual_step_probe()
    with probe.manual_step(info):
        yield info

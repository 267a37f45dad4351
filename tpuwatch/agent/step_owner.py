"""The step probe as its parts see it (``accumulator``, ``eager_loop``, ``strategy_run``).

``steps.StepProbe`` owns these parts and imports them; they reach back into it only through
:class:`StepOwner`, so none of them imports ``steps`` and the step probe's modules form no circle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.read_pacer import ReadPacer


class _Trace(Protocol):
    @property
    def current_top(self) -> Any: ...


class _StrategyRun(Protocol):
    @property
    def depth(self) -> int: ...


class StepOwner(Protocol):
    """What ``steps.StepProbe`` offers the parts it owns."""

    agent: Agent
    perf: Callable[[], float]
    pacer: ReadPacer
    eager_wait_s: float
    eager_examples: int | None
    eager_losses: dict[int, tuple[tuple[int, bool], float]]
    on_training_strategy: Callable[[Any], None] | None
    accumulator: Any
    acc_last: Any
    read_accumulator: Callable[[], Any]
    _steady: Any  # the step probe's steady record: reset when the pacer changes outside it

    @property
    def trace(self) -> _Trace: ...
    @property
    def strategy_run(self) -> _StrategyRun: ...

    def mark(self, key: str, value: Any = True) -> None: ...
    def first_strategy_if_none(self) -> None: ...
    def _emit(self, fn_name: str, steps: int, step_time_s: float, wait_s: float | None,
              losses: tuple[float, ...] | None, examples: int | None) -> None: ...

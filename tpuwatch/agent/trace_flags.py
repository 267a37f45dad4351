"""What each tf.function's trace did, as flags on the function: ``{"training": True, "acc": True,
"loss": slot, "runs": True, ...}``.

The probes mark (:meth:`TraceFlags.mark`) while TensorFlow traces: a gradient marks ``training``,
the replica-loss probe the slot that keeps the loss, the accumulator ``acc``. Every function being
traced gets the mark (a nested function's flags propagate to every function traced around it, so
an outer function that calls an inner one traced earlier is flagged too), and so does the
top-level function being called; the step probe reads them at each top-level call (is this a step
function, what to read after it). Weak keys: Keras recreates its functions on recompile.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpuwatch.agent.strategy_run import EagerStrategyRun


class TraceFlags:
    """The flags of every tf.function seen, the functions being traced now, and the top-level call
    under way (training thread; replica threads read while it waits)."""

    def __init__(self, strategy_run: "EagerStrategyRun") -> None:
        self.flags: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
        # Functions being traced right now (outermost first), each with the graph it is called
        # from. Only the training thread traces top-level functions; MirroredStrategy's replica
        # threads run while it waits, so a plain list read from those threads is accurate.
        self.tracing: list[tuple[Any, Any]] = []
        self.current_top: Any = None  # the top-level Function being called now
        self.training_marks = 0  # how many times "training" was marked (a run trains if it grows)
        # Bumped on every flag written: what a record worked out from a function's flags holds
        # while this is unchanged (the step probe's steady records).
        self.generation = 0
        self._strategy_run = strategy_run  # an eager strategy.run has no function: it keeps its own

    def mark(self, key: str, value: Any = True) -> None:
        """Flags every function being traced (and the top-level one being called)."""
        for fn, _ in self.tracing:
            self.flag(fn, key, value)
        if self.current_top is not None:
            self.flag(self.current_top, key, value)
        if key == "training":
            self.training_marks += 1
        if self._strategy_run.depth:
            self._strategy_run.marked(key, value)

    def flag(self, fn: Any, key: str, value: Any) -> None:
        """Flags ``fn`` alone."""
        try:
            flags = self.flags.get(fn)
            if flags is None:
                flags = self.flags[fn] = {}
            flags[key] = value
            self.generation += 1
        except TypeError:  # not weak-referenceable: never a step function
            pass

    def propagate(self, flags: dict[str, Any]) -> None:
        """A function traced earlier is called inside another's trace: what it does, the caller
        does. Keys starting with ``_`` (its name, its first read) are its own, and its training
        steps counted without an op are counted at the call site (``StepProbe.count_nested_runs``)."""
        for key, value in flags.items():
            if not key.startswith("_") and key != "implicit_runs":
                self.mark(key, value)

    def flags_of(self, fn: Any) -> dict[str, Any]:
        """``fn``'s flags (empty if none)."""
        try:
            return self.flags.get(fn) or {}
        except TypeError:
            return {}

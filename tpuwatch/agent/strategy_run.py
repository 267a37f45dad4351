"""``strategy.run`` called eagerly at the top level, as a step boundary.

A loop that calls ``strategy.run(step_fn, ...)`` eagerly, with no tf.function around it, has no
step call to time: the ``run`` is the step if its replicas computed gradients (evaluation and
setup runs are not steps). Commands wait for it (a safe point before it), what the replicas do is
marked on it rather than on a function, and each replica's loss is kept as a value while it runs
(:mod:`tpuwatch.agent.replica_loss`, which patches ``run`` and calls :meth:`EagerStrategyRun.step`).
On the training thread only; no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from tpuwatch.agent.step_owner import StepOwner


class EagerStrategyRun:
    """The top-level eager ``strategy.run`` under way, if any."""

    def __init__(self, probe: "StepOwner") -> None:
        self.probe = probe
        self.depth = 0  # top-level eager strategy.run calls under way (0 or 1)
        self.trained = False  # its replicas computed gradients
        self.flags: dict[str, Any] = {}  # what was marked while it ran (see StepProbe.mark)

    def marked(self, key: str, value: Any) -> None:
        """Something was marked while it runs (``training``: a gradient)."""
        if key == "training":
            self.trained = True
        self.flags[key] = value

    def step(self, call: Callable[[], Any], strategy: Any,
             read_losses: Callable[[], tuple[float, ...] | None]) -> Any:
        """Runs ``call`` (the original ``strategy.run``) as one: a Step if its replicas computed
        gradients, with ``read_losses()`` (each replica's, read while the run is still the current
        one), else a pause in training. Returns what ``call`` returns."""
        probe = self.probe
        agent = probe.agent
        if agent.has_pending:
            agent.safe_point()
        self.depth += 1
        self.trained = False
        self.flags = {}
        probe.eager_losses = {}
        losses = None
        try:
            start = probe.perf()
            result = call()
            elapsed = probe.perf() - start
            trained = self.trained
            if trained:
                self.flags["strategy"] = strategy
                losses = read_losses()
        finally:
            self.depth -= 1
        if trained:
            try:
                if probe.on_training_strategy is not None:
                    probe.on_training_strategy(strategy)
                self.record(elapsed, losses)
            except Exception as e:  # a probe never raises into the script
                agent.probe_failed("steps", e)
        else:
            probe.eager_wait_s = 0.0
            try:
                agent.phases.other_call("strategy.run", start)
            except Exception as e:  # likewise
                agent.probe_failed("phases", e)
        return result

    def record(self, call_s: float, losses: tuple[float, ...] | None) -> None:
        """The Step of a run that trained: its time, and the input wait before it."""
        probe = self.probe
        wait = probe.eager_wait_s
        probe._emit("strategy.run", 1, call_s + wait, wait if wait > 0 else None, losses, probe.eager_examples)

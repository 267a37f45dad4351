"""A top-level tf.function call running eagerly (``tf.config.run_functions_eagerly(True)``).

Such a call has no graph to count its training steps in: it counts its ``strategy.run``s whose
replicas computed gradients, else the most gradients taken with respect to one set of variables
outside any (a loop over batches with a GAN's two tapes each counts its batches; gradients with
respect to tensors only count none), and none if it computed no gradient. Each replica's loss is
kept as a value while it runs (the step probe's ``eager_losses``, filled by the replica-loss
probe). Whether a call runs eagerly is read when it starts. On the training thread only.
"""

from __future__ import annotations

from typing import Any, Callable


class EagerFunctionCall:
    """The eager call under way: whether there is one, and what it trained."""

    def __init__(self) -> None:
        self.active = False
        self.runs = 0  # its strategy.runs whose replicas computed gradients
        # Gradients taken outside any strategy.run, by the variables they were taken with respect
        # to (ids of the first and last source; ``()``: tensors only).
        self._gradients: dict[tuple[int, ...], int] = {}
        # Reads the losses kept while it ran (set by the replica-loss probe).
        self.loss_reader: Callable[[dict[str, Any]], tuple[float, ...] | None] | None = None

    def start(self) -> None:
        """A top-level tf.function call is about to run eagerly."""
        self.active = True
        self.runs = 0
        self._gradients = {}

    def gradient(self, variables: tuple[int, ...]) -> None:
        """It took a gradient outside any strategy.run."""
        counts = self._gradients
        counts[variables] = counts.get(variables, 0) + 1

    def steps(self) -> int:
        """Its training steps: its strategy.runs that trained; else its step index; 0 if it
        computed no gradient."""
        return self.runs or self.step_index()

    def step_index(self) -> int:
        """Steps so far by its gradients outside any strategy.run: the most taken with respect to
        one set of variables, or 1 if all were with respect to tensors only (traced, those train:
        a TPU embedding's)."""
        counts = self._gradients
        if not counts:
            return 0
        return max((n for key, n in counts.items() if key), default=1)

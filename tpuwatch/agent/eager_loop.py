"""A loop with no tf.function (TF's custom training walkthrough): where its steps begin and end.

There is no call to time: a step is an eager optimizer update (Keras 3 ``apply``, tf_keras
``apply_gradients``) after at least one eager gradient with respect to variables, timed from the
outermost gradient tape first opened since the last step, plus the input wait before that tape (a
fetch inside the step is in its time already); its loss is the first of those gradients' target.
An update of other variables with no input fetched since the last eager step (a GAN's generator
update after its discriminator's, on one batch) belongs to that step, and its time is added to the
next step's; an update of the same variables again is the next step (a loop over NumPy slices
fetches nothing). Micro-batches accumulated before one update are one step. A gradient with
respect to tensors only (an FGSM perturbation, a gradient penalty) is no step, though its tape is
part of the next one; its target is the loss shown only if no gradient with respect to variables
follows.

:class:`EagerLoop` owns that state; the step probe (:mod:`tpuwatch.agent.steps`) owns the record it
makes, the input wait and the read pacer. On the training thread only; no I/O.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from tpuwatch.agent.step_owner import StepOwner


class EagerLoop:
    """The eager loop's step in progress, and the one before it."""

    def __init__(self, probe: "StepOwner") -> None:
        self.probe = probe
        self.agent = probe.agent
        self.perf = probe.perf
        # The step in progress (see applied): when its first tape opened, whether
        # an eager gradient ran, the loss tensor of the first one, and optimizer-update nesting.
        self.start: float | None = None
        self.gradients = False
        self.loss: Any = None
        self.loss_of_variables = False
        self.applying = 0
        self.fetches = 0  # eager input fetches since the last step
        self._tape: Any = None  # weak reference to the tape that opened the step
        self._wait_at_start = 0.0  # eager input wait before that tape opened
        self._last = False  # the last step recorded was an eager loop's
        self._extra_s = 0.0  # time of later updates on that step's batch (a GAN's generator)
        # Which variables (ids of the first and last source of each gradient) the gradients of the
        # step in progress, and of that step, were taken with respect to; its updates, and how
        # many updates the step before it had (a GAN's: 2).
        self._window_vars: set[int] = set()
        self._step_vars: set[int] = set()
        self._step_updates = 0
        self._cycle = 1
        self._held_at: int | None = None  # fetch count when a tensors-only gradient held the clock

    def top(self) -> bool:
        """Eager code outside any step being measured (a tf.function call, an eager
        ``strategy.run``, a ``tpuwatch.step()``)."""
        from tensorflow.python.eager import context

        probe = self.probe
        return probe.trace.current_top is None and not probe.strategy_run.depth and context.executing_eagerly()

    def tape_entered(self, tape: Any) -> None:
        """An eager gradient tape opened: the outermost one first opened since the last step starts
        the next (a tape nested in it, or the same tape entered again by tf_keras' ``minimize(...,
        tape=tape)``, does not)."""
        if self.gradients or not self.top():
            return
        from tensorflow.python import pywrap_tfe

        if not pywrap_tfe.TFE_Py_TapeSetIsEmpty():
            return
        if self._tape is not None and self._tape() is tape:
            return
        if self._held_at is not None and self._held_at == self.fetches:
            return  # after an FGSM-style gradient on this batch: the step began at its tape
        # Commands wait while the step's batch has updates to come (a checkpoint between a GAN's
        # discriminator and generator updates would hold one updated and not the other).
        if self.agent.has_pending and not (self._continues_step() and self._step_updates < self._cycle):
            self.agent.safe_point()
        self._start()
        try:
            self._tape = weakref.ref(tape)
        except TypeError:
            self._tape = None

    def stepped(self) -> None:
        """A step of any kind was recorded: eager gradients before it belonged to it (or to
        nothing), and no eager step is the last one."""
        if self.start is None and self.loss is None and not (self.gradients or self.fetches or self._last):
            # Nothing eager since the last step (a tf.function loop): all is as this leaves it.
            # No tape opened (its start), no gradient (its window's variables), no update of an
            # eager step (the last-step state is set only with _last).
            return
        self.clear_window()
        self.fetches = 0
        self._last = False
        self._extra_s = 0.0
        self._step_vars = set()
        self._step_updates = 0

    def clear_window(self) -> None:
        """Forgets the eager work since the last update: its tapes, gradients and loss."""
        self.gradients = False
        self.start = None
        self.loss = None
        self.loss_of_variables = False
        self._tape = None
        self._held_at = None
        self._window_vars = set()

    def _start(self) -> None:
        self.start = self.perf()
        self._wait_at_start = self.probe.eager_wait_s

    def _continues_step(self) -> bool:
        """More work on the last eager step's batch: no fetch since, and (once the gradients are
        known) other variables."""
        return self._last and self.fetches == 0 and not (self._window_vars & self._step_vars)

    def fetched(self) -> None:
        """The script fetched a batch eagerly (the input-wait probe has added its wait)."""
        self.fetches += 1

    def gradient(self, variables: tuple[int, ...]) -> None:
        """An eager top-level ``tape.gradient`` with respect to variables ran (its loss is kept by
        the replica-loss probe); ``variables``: ids of its first and last source."""
        if self.start is None:  # a tape entered before the agent was installed
            self._start()
        self.gradients = True
        self._window_vars.update(variables)

    def probe_gradient(self) -> None:
        """An eager top-level gradient with respect to tensors only (an FGSM perturbation): no
        step, but the work of the one that follows on this batch (the clock runs on)."""
        if self.start is None:
            self._start()
        self._held_at = self.fetches

    def applied(self) -> None:
        """An eager optimizer update ended: one step of a loop with no tf.function, if eager
        gradients were computed for it (on the training thread; no I/O)."""
        if not self.gradients:
            return
        now = self.perf()
        call_s = now - (self.start if self.start is not None else now)
        target = self.loss
        window_vars = self._window_vars
        continues = self._continues_step()
        self.clear_window()
        if continues:
            self._extra_s += call_s  # counted in the next step's time
            self._step_vars |= window_vars
            self._step_updates += 1
            return
        cycle = self._step_updates or 1
        probe = self.probe
        probe._steady = None  # what it worked out assumed the pacer as it was
        pacer = probe.pacer
        read_all = pacer.read_all
        pacer.recorded()
        wait_s = probe.eager_wait_s  # every fetch of the step; those after its tape opened are in call_s
        step_time_s = call_s + self._wait_at_start + self._extra_s
        trained = pacer.trained(step_time_s)
        losses = None
        if target is not None and (read_all or pacer.loss_due(trained)):
            try:
                import tensorflow as tf

                began = probe.perf()
                losses = (float(tf.reduce_mean(tf.cast(target, tf.float32)).numpy()),)
                pacer.spent(probe.perf() - began)
                pacer.loss_read(trained, now, self.agent.global_step + 1)
            except Exception as e:
                self.agent.probe_failed("replica_loss", e)
        probe.first_strategy_if_none()
        probe._emit("eager loop", 1, step_time_s, wait_s if wait_s > 0 else None, losses, probe.eager_examples)
        self._last = True
        self._step_vars = window_vars
        self._step_updates = 1
        self._cycle = cycle

    def make_update_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """Wraps an optimizer's update method: an eager top-level update may end a step."""
        loop = self
        agent = self.agent

        def update(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if loop.applying or "steps" in agent._disabled:
                return original(optimizer, *args, **kwargs)
            try:
                top = loop.top()
            except Exception as e:
                agent.probe_failed("steps", e)
                top = False
            if not top:
                return original(optimizer, *args, **kwargs)
            loop.applying += 1
            try:
                result = original(optimizer, *args, **kwargs)
            finally:
                loop.applying -= 1
            try:
                loop.applied()
            except Exception as e:
                agent.probe_failed("steps", e)
            return result

        return update

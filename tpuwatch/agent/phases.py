"""What the training process is doing, coarsely: one :class:`~tpuwatch.protocol.Phase` per change.

Phases are never sent per step. The training thread changes ``PhaseTracker.current`` only when
the kind of work changes (the first step after an evaluation, a checkpoint save, a new iterator
over a distributed dataset); per step it costs one attribute compare (``on_step``). An
evaluation's progress (its test-step calls) is counted on the training thread and published by
the agent's thread at the sample rate (``sample``), so a viewer can tell a progressing evaluation
from a hung one.

Where each phase comes from:

- *starting*: the process's launch (its creation time) until the first step call;
- *training*: a step record (:mod:`tpuwatch.agent.steps`), from the start of its call;
- *evaluating*: Keras ``on_test_begin``/``on_predict_begin`` (:mod:`tpuwatch.agent.keras_hooks`),
  or, after training began, two top-level calls in a row of a tf.function (or eager
  ``strategy.run``) that computes no gradient (a custom loop's test step; one such call between
  two steps, a metric update, stays part of training);
- *checkpointing*: ``tf.train.Checkpoint.save``/``write``, ``CheckpointManager.save``, Keras
  ``Model.save``/``save_weights`` (which ``ModelCheckpoint`` and ``BackupAndRestore`` call),
  tpuwatch's own checkpoint command;
- *iterator*: ``iter()`` of a distributed dataset (a custom loop's epoch boundary);
- *host*: the script's own Python after one of those, until the next step;
- *finishing*: the script returned; the process is exiting.

Patches are reversible (:class:`~tpuwatch.agent.patches.Patches`) and never raise into user code.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

from tpuwatch.protocol import Phase

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent, Phases
    from tpuwatch.agent.patches import Patches

PROBE = "phases"

#: (module, class, method, phase, detail): methods whose call is one phase.
PHASED_METHODS: tuple[tuple[str, str, str, str, str], ...] = (
    ("tensorflow.python.checkpoint.checkpoint", "Checkpoint", "save", "checkpointing", "Checkpoint.save"),
    ("tensorflow.python.checkpoint.checkpoint", "Checkpoint", "write", "checkpointing", "Checkpoint.write"),
    ("tensorflow.python.checkpoint.checkpoint_management", "CheckpointManager", "save", "checkpointing",
     "CheckpointManager.save"),
    ("keras.src.models.model", "Model", "save", "checkpointing", "Model.save"),
    ("keras.src.models.model", "Model", "save_weights", "checkpointing", "Model.save_weights"),
    ("tf_keras.src.engine.training", "Model", "save", "checkpointing", "Model.save"),
    ("tf_keras.src.engine.training", "Model", "save_weights", "checkpointing", "Model.save_weights"),
    ("tensorflow.python.distribute.input_lib", "DistributedDataset", "__iter__", "iterator",
     "DistributedDataset.__iter__"),
    ("tensorflow.python.distribute.input_lib", "DistributedDatasetsFromFunction", "__iter__", "iterator",
     "DistributedDatasetsFromFunction.__iter__"),
)


def process_start_time(default: float) -> float:
    """The unix time this process was launched (psutil), else ``default``."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # psutil missing or /proc unreadable: the agent's start is close enough
        return default


class PhaseTracker:
    """The current phase of this process (training thread writes, agent thread reads)."""

    def __init__(self, agent: "Agent", perf: Callable[[], float] = time.perf_counter) -> None:
        self.agent = agent
        self.perf = perf
        self.current = "starting"
        self.detail = ""
        self.since = agent.clock()
        self.calls = 0  # top-level calls in this phase (an evaluation's test steps)
        self._sent_calls = 0
        self._depth = 0  # nesting of phased calls (Model.save calls save_weights)
        self.pending = 0  # non-training top-level calls since the last step
        self._pending_t = 0.0  # unix time the first of them began
        self._pending_name = ""
        self.enabled = True  # False: --disable phases (the state is kept, nothing is sent)

    def start(self, since: float) -> None:
        """The run's first phase: starting, from the process's launch."""
        self.since = since
        self._send(self.agent.clock())

    def enter(self, phase: str, detail: str = "", t: float | None = None) -> None:
        """The process now does ``phase`` (from ``t``, unix; default now). No message if unchanged."""
        if phase == self.current and detail == self.detail:
            return
        self.current, self.detail = phase, detail
        self.since = self.agent.clock() if t is None else t
        self.calls = self._sent_calls = 0
        self._send(self.since)

    def _send(self, t: float) -> None:
        if not self.enabled or PROBE in self.agent._disabled:  # --disable phases, or a bug seen once
            return
        self.agent.emit(Phase(t=t, phase=self.current, since=self.since, detail=self.detail,  # type: ignore[arg-type]
                              step=self.agent.global_step, calls=self.calls))

    @contextlib.contextmanager
    def during(self, phase: str, detail: str) -> Iterator[None]:
        """The block is one ``phase`` (the outermost of nested ones counts); afterwards *host*."""
        outer = self._depth == 0
        self._depth += 1
        if outer:
            self._safely(lambda: self.enter(phase, detail))
        try:
            yield
        finally:
            self._depth -= 1
            if outer:
                self._safely(lambda: self.enter("host"))

    def begin(self, phase: str, detail: str) -> None:
        """A phase that a pair of callbacks brackets (Keras ``on_test_begin``/``on_test_end``)."""
        if self._depth == 0:
            self.enter(phase, detail)
        self._depth += 1

    def end(self) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth == 0:
            self.enter("host")

    def on_step(self, name: str, start_t: float) -> None:
        """A step record was made (training thread); its call began at ``start_t`` (unix)."""
        self.pending = 0
        if self.current != "training" and self._depth == 0:
            self._safely(lambda: self.enter("training", name, start_t))

    def other_call(self, name: str, start_perf: float) -> None:
        """A top-level call that computed no gradient ended (training thread)."""
        if self._depth:
            self.calls += 1  # inside an evaluation Keras announced (or a save)
            return
        if self.current == "evaluating":
            self.calls += 1
            return
        if self.agent.global_step <= 0:
            return  # before training: setup is part of starting
        self.pending += 1
        if self.pending == 1:
            self._pending_t = self.agent.clock() - (self.perf() - start_perf)
            self._pending_name = name
        elif self.pending == 2:  # two in a row with no step between: an evaluation loop
            self._safely(lambda: self.enter("evaluating", self._pending_name, self._pending_t))
            self.calls = 2

    def finishing(self) -> None:
        self._depth = 0
        self._safely(lambda: self.enter("finishing"))

    def sample(self) -> list[Phase]:
        """Agent thread: the current phase again if its call count grew since last sent."""
        calls = self.calls
        if calls == self._sent_calls:
            return []
        self._sent_calls = calls
        return [Phase(t=self.agent.clock(), phase=self.current, since=self.since,  # type: ignore[arg-type]
                      detail=self.detail, step=self.agent.global_step, calls=calls)]

    def _safely(self, fn: Callable[[], None]) -> None:
        """Runs a change; a failure disables the probe (reported once), never reaches the script."""
        try:
            fn()
        except Exception as e:  # called from the script's own calls: the probe stops, the script goes on
            self.agent.probe_failed(PROBE, e)


def _phased(tracker: "Phases", phase: str, detail: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with tracker.during(phase, detail):
                return original(*args, **kwargs)

        return wrapper

    return make


def install(agent: "Agent", patches: "Patches") -> "Phases":
    """Patches the checkpoint, save and distributed-iterator methods as their modules are imported."""
    from tpuwatch.agent import post_import

    tracker = agent.phases

    def patcher(cls_name: str, method: str, phase: str, detail: str) -> Callable[[Any], None]:
        def patch(module: Any) -> None:
            cls = getattr(module, cls_name, None)
            if cls is not None and method in vars(cls):
                patches.wrap(cls, method, _phased(tracker, phase, detail))

        return patch

    for module, cls_name, method, phase, detail in PHASED_METHODS:
        post_import.when_imported(module, patcher(cls_name, method, phase, detail),
                                  lambda e: agent.probe_failed(PROBE, e))
    agent.add_sampler(PROBE, tracker.sample)
    return tracker

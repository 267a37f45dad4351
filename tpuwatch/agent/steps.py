"""Training steps: which tf.function is the step, how long each call takes, and safe points.

A *step function* is a tf.function whose trace computes gradients (``GradientTape.gradient``),
directly or through a nested tf.function that does. Keras' ``multi_step_on_iterator`` is one, and
so is a custom ``@tf.function train_step`` around ``strategy.run``; evaluation and prediction
functions are not. A top-level eager call of a step function is one record (``steps`` > 1 when
the call runs several training steps: Keras ``steps_per_execution`` or a ``tf.range`` loop, counted
in-graph). An eager ``strategy.run`` whose replicas compute gradients is a step too.

A loop with no tf.function at all (TF's custom training walkthrough) has no call to time: its
steps are found by :mod:`tpuwatch.agent.eager_loop` from its tapes, gradients and optimizer
updates. An update whose gradients a tf.function computed was counted with that function.

A step function running eagerly (``tf.config.run_functions_eagerly(True)``) has no graph to count
in: :mod:`tpuwatch.agent.eager_function` counts its steps.

Per-step figures that live inside the compiled function (input wait, training steps run, examples)
are accumulated in-graph (:mod:`tpuwatch.agent.accumulator`), read once after each step call;
per-replica losses come from :mod:`tpuwatch.agent.replica_loss`. Only training counts: the
accumulator's contributions from evaluation and prediction calls are dropped after those calls.

Commands run at *safe points*: on the training thread just before a step call, never from
another thread (checkpoints taken from another thread were inconsistent).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator

from tpuwatch.agent import accumulator, clocks
from tpuwatch.agent.accumulator import EXAMPLES, FETCHES, RUNS, WAIT_S
from tpuwatch.agent.eager_function import EagerFunctionCall
from tpuwatch.agent.eager_loop import EagerLoop
from tpuwatch.agent.fetch_order import FetchOrder
from tpuwatch.agent.read_pacer import ReadPacer
from tpuwatch.agent.strategy_run import EagerStrategyRun
from tpuwatch.agent.trace_flags import TraceFlags
from tpuwatch.protocol import Config, StepLoss, step_values

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.patches import Patches


class StepProbe:
    """State shared by the step, input-wait and replica-loss probes."""

    def __init__(self, agent: "Agent") -> None:
        self.agent = agent
        self.perf = clocks.perf
        self.strategy_run = EagerStrategyRun(self)  # a top-level eager strategy.run under way
        self.trace = TraceFlags(self.strategy_run)  # what each tf.function's trace did
        self.mark = self.trace.mark  # the accumulator marks the functions it counts in
        self.eager_wait_s = 0.0  # eager input fetch time since the last step ended
        self.eager_distributed_fetches = 0  # distributed batches fetched eagerly (between steps), all told
        self.eager_examples: int | None = None
        self.accumulator = None  # tf ResourceVariable float64[4], created on first in-graph use
        self.read_accumulator: Callable[[], Any] = lambda: None
        self.acc_last: Any = None
        self.loss_reader: Callable[[dict[str, Any]], tuple[float, ...] | None] | None = None  # from a function's flags
        # Each replica's loss kept as a value by a top-level eager strategy.run or a tf.function
        # running eagerly (tf.config.run_functions_eagerly): {replica id: ((step within the call,
        # of variables), loss)}; and how many strategy.runs of such a function trained.
        self.eager_losses: dict[int, tuple[tuple[int, bool], float]] = {}
        self.eager_function = EagerFunctionCall()  # a top-level tf.function call running eagerly
        # Called on each tape.gradient(target, sources) with the target (the loss in every training
        # loop) and whether any source is a variable.
        self.gradient_hooks: list[Callable[[Any, bool], None]] = []
        # Called with the strategy object of a step that trained (topology follows training).
        self.on_training_strategy: Callable[[Any], None] | None = None
        self.step_context: Callable[[int], ContextManager[Any]] | None = None  # set by the profiler
        # Called before the first top-level call of each tf.function (eager, cross-replica
        # context): probes make their variables there rather than inside the trace.
        self.before_first_call: list[Callable[[], None]] = []
        self.epoch_source: Any = None  # keras_hooks.KerasHooks: its .epoch is the current epoch
        self._config_batch: int | None = None
        self.last_loss: tuple[int, float, int] | None = None  # (step, mean, replicas) last read
        self.pacer = ReadPacer.from_settings()  # when losses and the accumulator are read
        self._unread: tuple[dict[str, Any], int] | None = None  # (flags, step) of a record sent without losses
        self._acc_unread_steps = 0  # training steps since the accumulator was last read
        self._last_strategy: Any = None
        # The steady record (see record): (flags, trace generation, steps a call added to the
        # accumulator's unread count, steps a call, losses kept, and the pacer's last reads: the
        # losses' and the accumulator's training time and the pace); None when none applies.
        self._steady: tuple[dict[str, Any], int, int, int, bool, float, float, float] | None = None
        # Graph -> training steps traced into it that run once per call (see count_training_runs).
        self._implicit_runs: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._gradient_graphs: weakref.WeakSet[Any] = weakref.WeakSet()
        self.fetch_order = FetchOrder()  # calls after an in-graph fetch wait for its timestamp
        self.eager_loop = EagerLoop(self)  # a loop with no tf.function: its step in progress

    # --- flags ------------------------------------------------------------------------------

    @property
    def training_marks(self) -> int:
        """How many gradients were marked so far (the retrace probe asks whether a trace trained)."""
        return self.trace.training_marks

    def count_nested_runs(self, fn: Any, call_site: Any) -> None:
        """``fn`` was just called inside another function's trace, from graph ``call_site``: the
        training steps it runs once per call run as often as that call site does."""
        runs = self.trace.flags_of(fn).get("implicit_runs")
        if runs and call_site is not None:
            self.count_training_runs(call_site, runs)

    def count_training_runs(self, graph: Any, n: int = 1) -> None:
        """``n`` training steps were traced into ``graph`` (a ``strategy.run`` whose replicas
        computed gradients, or a gradient outside any ``strategy.run``).

        In a function's own graph they run exactly once per call of that function, so they are
        counted with no op at all (the usual ``train_step``; a nested function's count is added
        to its caller's at the call site). In a loop body, a branch, or a ``for x in dataset``
        reduce function, one in-graph add counts each execution. The count is kept per function,
        not per trace: a function retraced into another shape is counted by its last trace.
        """
        trace = self.trace
        owner, call_site = trace.tracing[-1] if trace.tracing else (trace.current_top, None)
        outer = graph.outer_graph
        # The function's own graph: made in its call site's graph (or, for a top-level call,
        # outside any function or inside TF's own initialising wrapper). Anything else is a loop
        # body, a branch or a tf.data function inside it.
        if call_site is not None:
            own = outer is call_site
        else:
            own = not getattr(outer, "building_function", False) or _initialising_wrapper(outer)
        if owner is None or not own or getattr(graph, "is_control_flow_graph", False):
            accumulator.add_constant(self, RUNS, float(n))
            trace.mark("runs")
            trace.mark("acc_runs")  # the accumulator holds this function's step count
            return
        total = self._implicit_runs.get(graph, 0) + n
        self._implicit_runs[graph] = total
        trace.flag(owner, "implicit_runs", total)
        trace.mark("runs")

    def count_gradient_step(self, graph: Any) -> None:
        """A gradient outside any ``strategy.run`` (a loop with no strategy): one step per graph,
        however many tapes it has (a GAN's two)."""
        if graph in self._gradient_graphs:
            return
        self._gradient_graphs.add(graph)
        self.count_training_runs(graph)

    # --- the wrapper of Function.__call__ -------------------------------------------------------

    def make_call_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        probe = self
        agent = self.agent
        from tensorflow.python import pywrap_tfe
        from tensorflow.python.eager import context
        from tensorflow.python.framework.errors_impl import OutOfRangeError

        executing_eagerly = context.executing_eagerly
        tape_set_is_empty = pywrap_tfe.TFE_Py_TapeSetIsEmpty
        disabled = agent._disabled  # read per call: a dict lookup, not a method call
        pending = agent._pending
        perf = self.perf
        switch = _functions_eagerly_switch()
        strategy_run = self.strategy_run
        trace = self.trace
        eager_function = self.eager_function
        # The last top-level function called, weakly, with its flags, as one tuple (read and
        # replaced whole: another thread's call never sees one function with another's flags): a
        # loop calls one function over and over, and a weak-dict lookup is a Python call and a new
        # weak reference each.
        last: list[tuple[Any, dict[str, Any]] | None] = [None]

        def __call__(fn: Any, *args: Any, **kwargs: Any) -> Any:
            if trace.current_top is not None or strategy_run.depth or not executing_eagerly():
                # A nested call, a call while tracing, or one inside an eager strategy.run.
                flags = trace.flags_of(fn)
                if flags:
                    try:
                        trace.propagate(flags)
                    except Exception as e:
                        agent.probe_failed("steps", e)
                if executing_eagerly() and not strategy_run.depth:
                    return original(fn, *args, **kwargs)
                # Traced now, or called from an eager strategy.run (which traces it on first use:
                # its trace's flags must land on it so later eager runs know what it does).
                call_site = current_graph()
                fetched = probe.fetch_order.before_call(call_site)
                trace.tracing.append((fn, call_site))
                try:
                    result = original(fn, *args, **kwargs)
                finally:
                    trace.tracing.pop()
                if fetched is not None:
                    try:
                        probe.fetch_order.after_call(call_site, fetched)
                    except Exception as e:
                        agent.probe_failed("input_wait", e)
                try:
                    probe.count_nested_runs(fn, call_site)
                except Exception as e:
                    agent.probe_failed("steps", e)
                return result
            if "steps" in disabled:
                return original(fn, *args, **kwargs)
            # A top-level eager call: a step boundary if this is a step function. Per call this
            # path does one weak-dict lookup (none when the function is the last one's); the first
            # call of each function does the rest.
            seen = last[0]
            if seen is not None and seen[0]() is fn:
                flags = seen[1]
            else:
                try:
                    known: dict[str, Any] | None = trace.flags.get(fn)
                except TypeError:  # not weak-referenceable: never a step function
                    return original(fn, *args, **kwargs)
                if known is None or "_name" not in known:
                    for prepare in probe.before_first_call:
                        prepare()
                    if known is None:
                        known = trace.flags[fn] = {}
                    known["_name"] = _name_of(fn)
                flags = known
                last[0] = (weakref.ref(fn), flags)
            was_step = "training" in flags
            if was_step and pending:
                agent.safe_point()
            ctx = probe.step_context
            eagerly = switch.RUN_FUNCTIONS_EAGERLY  # tf.config.run_functions_eagerly(True)
            if eagerly:
                probe.start_eager_function()
            trace.current_top = fn
            start = perf()
            try:
                if ctx is not None and was_step:
                    with ctx(agent.global_step + 1):
                        result = original(fn, *args, **kwargs)
                else:
                    result = original(fn, *args, **kwargs)
            except (OutOfRangeError, StopIteration):
                # The data ran out inside the call, after the steps handed a batch (a loop called
                # until its dataset ends; Keras 3.3's steps_per_execution; StopIteration: next()
                # on a function running eagerly)
                end = perf()
                trace.current_top = None
                eager_function.active = False
                try:
                    if "training" in flags:
                        probe.record_cut_short(flags, end - start, end, eagerly)
                    elif not (probe.eager_loop.applying or not tape_set_is_empty()):
                        probe.other_call_ended(flags, start, end)
                except Exception as e:
                    agent.probe_failed("steps", e)
                raise
            finally:
                trace.current_top = None
                eager_function.active = False
            end = perf()
            if was_step or "training" in flags:
                try:
                    probe.record(flags, end - start, end, eagerly)
                except Exception as e:
                    agent.probe_failed("steps", e)
            elif probe.eager_loop.applying or not tape_set_is_empty():
                pass  # a helper inside an eager loop's step (its forward pass, tf_keras' XLA update)
            else:
                try:
                    probe.other_call_ended(flags, start, end)
                except Exception as e:
                    agent.probe_failed("steps", e)
            return result

        return __call__

    def other_call_ended(self, flags: dict[str, Any], start: float, end: float) -> None:
        """A top-level call of evaluation, prediction or setup ended (or ran out of data): neither
        its time nor its in-graph fetches belong to a training step. Training paused: the last
        step's losses may be due."""
        fetched_s, self.eager_wait_s = self.eager_wait_s, 0.0
        self.eager_examples = None
        self.agent.phases.other_call(flags["_name"], start - fetched_s)  # its batch's fetch too
        if self.accumulator is not None and "acc" in flags:
            self.acc_last = self.read_accumulator().tolist()
            self._acc_unread_steps = 0
        self.read_unread_losses(end)

    # --- records --------------------------------------------------------------------------------

    def record_cut_short(self, flags: dict[str, Any], call_s: float, now: float, eagerly: bool) -> None:
        """A step call ran out of data (``OutOfRangeError``) after some of its steps were handed
        a batch. Those are recorded: a loop's by its count in the accumulator (its iterations
        run one after another), a fixed number a call by the batches its steps fetched: a plain
        iterator's fetch in a graph runs after the previous fetch's count is added, so the fetch
        that found no batch aborted the call with the others counted (:mod:`.input_wait`); a
        distributed iterator's fetches are not ordered so, and the last may not be counted yet.
        Whether TensorFlow ran the last step's update before the abort is its own: the step had
        its batch. A call whose steps nothing in the graph counts is not recorded (how many ran
        is not known). The optimizer's ``iterations`` is no measure: its increment needs no
        batch, and TensorFlow ran it for steps whose fetch failed."""
        if eagerly:
            self.record(flags, call_s, now, eagerly=True)  # its steps were counted as they ran
            return
        if self.accumulator is None or "acc" not in flags or self.acc_last is None:
            return
        ran = 0  # a loop's count is the accumulator's
        if "acc_runs" not in flags:
            acc = self.read_accumulator().tolist()
            # the function's fetches a step (1 until a whole call has shown it); a step whose
            # first fetch of two found a batch and whose second did not is not counted
            per_step = flags.get("_fetches_per_step", 1.0)
            fetched = (acc[FETCHES] - self.acc_last[FETCHES]) / per_step - self._acc_unread_steps
            ran = max(0, min(int(fetched + 1e-6), flags.get("implicit_runs", 0)))
            if ran == 0:  # its first fetch found no batch: it trained nothing
                self.eager_wait_s = 0.0
                self.eager_examples = None
                self.read_unread_losses(now)
                return
        self._steady = None
        self.record(flags, call_s, now, ran=ran)

    def record(self, flags: dict[str, Any], call_s: float, now: float, eagerly: bool = False,
               ran: int | None = None) -> None:
        """Emits one Step for a finished step call (on the training thread; no I/O); ``eagerly``:
        the call ran eagerly (``tf.config.run_functions_eagerly``); ``ran``: the training steps
        a call cut short ran, besides those the accumulator counts (record_cut_short)."""
        # The steady record: the same function as the last record, its flags unchanged since, and
        # no read due (tested as loss_due and acc_due test it). What the general path below would
        # work out for it is known from that last record (see _arm, which mirrors the general
        # path's step count and reads: a change to one is a change to both), so it is not worked
        # out again; a batch fetched eagerly before the call (the tutorial's ``for batch in
        # dist_dataset``) adds its wait and examples as the general path would. A loop with one
        # step function and its losses read takes this path for most records, right after
        # TensorFlow returns, on the training thread, where the general path's Python ran at
        # 10-15 us after the tiny step and ~40 us after the tutorial's 14 ms step.
        steady = self._steady
        if steady is not None and steady[0] is flags and not eagerly:
            _, generation, acc_steps, steps, keeps_loss, loss_at, acc_at, pace = steady
            pacer = self.pacer
            wait_s = self.eager_wait_s
            trained = pacer.trained_s + (call_s + wait_s)  # as pacer.trained adds it
            if trained - loss_at < pace and trained - acc_at < pace and generation == self.trace.generation:
                pacer.trained_s = trained
                self._acc_unread_steps += acc_steps
                self._emit(flags["_name"], steps, (call_s + wait_s) / steps, wait_s / steps if wait_s > 0.0 else None,
                           None, self.eager_examples)
                self._unread = (flags, self.agent.global_step) if keeps_loss else None
                return
        self._steady = None
        steps = flags.get("implicit_runs", 0) if ran is None else ran
        wait_s = self.eager_wait_s
        measured_wait = wait_s > 0.0
        examples = self.eager_examples
        # One of the run's first records: every sampled value is read while the reads cost at most
        # a hundredth of the training, each counted at READ_COST_FACTOR times its time (a short
        # run's diagnostics see its steps); later ones at most every pacer.every_s of training.
        pacer = self.pacer
        perf = self.perf
        read_all = pacer.read_all
        read_s = 0.0  # what this record's reads took (the first records' budget: read_pacer)
        # Training time is the step's own time, its wait for the batch included (an input-bound
        # loop is read as often as any other); evaluation and other pauses are not in it.
        trained = pacer.trained(call_s + wait_s)
        if self.accumulator is not None and "acc" in flags:
            # Read after every call when the call's step count is in there (a loop); otherwise it
            # holds only input wait and examples, which are sampled like losses: a read gives
            # their sum since the last one, spread over the steps in between.
            if "acc_runs" in flags or read_all or ran is not None or pacer.acc_due(trained):
                began = perf()
                acc = self.read_accumulator().tolist()  # Python floats: cheaper than numpy scalars
                read_s = perf() - began
                # (a loop's steps, counted in the graph, are known only from this read)
                pacer.acc_read(trained, None if "acc_runs" in flags else self.agent.global_step + max(steps, 1))
                last = self.acc_last
                self.acc_last = acc
                pending, self._acc_unread_steps = self._acc_unread_steps, 0
                if last is not None:
                    steps += int(round(acc[RUNS] - last[RUNS]))
                    if steps > 0 and acc[FETCHES] > last[FETCHES]:
                        waited_over = steps + pending
                        if ran is None:  # the batches a step fetches: a call cut short counts by them
                            flags["_fetches_per_step"] = (acc[FETCHES] - last[FETCHES]) / waited_over
                        else:  # a step cut short between its fetches fetched too: its share is its own
                            waited_over = max(waited_over, (acc[FETCHES] - last[FETCHES])
                                              / flags.get("_fetches_per_step", 1.0))
                        wait_s += (acc[WAIT_S] - last[WAIT_S]) * steps / waited_over
                        measured_wait = True
                        d_ex = acc[EXAMPLES] - last[EXAMPLES]
                        if d_ex > 0:
                            examples = int(round(d_ex / waited_over))
            else:
                self._acc_unread_steps += steps
        counted = "runs" in flags
        if eagerly:  # no graph counted them
            steps, counted = self.eager_function.steps(), True
            if examples and steps > 1:  # the call's steps fetched their batches as it ran: a step's
                examples = int(round(examples / steps))
        if steps <= 0:
            if counted:  # its training steps are counted, and this call ran none
                self.eager_wait_s = 0.0
                self.eager_examples = None
                self.read_unread_losses(now)
                return
            steps = 1
        pacer.recorded()
        step_time_s = (call_s + self.eager_wait_s) / steps
        # Each replica's loss is sampled like the wait (and read at a function's first record):
        # each read is a transfer per replica on a TPU, ~0.1 ms per replica on a CPU. A record
        # without one says so (loss None); the dashboard shows the last loss with its step.
        losses = None
        due = read_all or pacer.loss_due(trained) or "_read" not in flags
        # A call that ran eagerly kept its losses as values while it ran: they are always taken.
        reader = self.eager_function.loss_reader if eagerly else self.loss_reader if due else None
        if reader is not None:
            began = perf()
            losses = reader(flags)
            read_s += perf() - began
            if losses is not None:
                pacer.loss_read(trained, now, self.agent.global_step + steps)
                if not eagerly:
                    flags["_read"] = True
        if read_s:
            pacer.spent(read_s)
        strategy = flags.get("strategy")
        if strategy is None and self._last_strategy is None:
            strategy = _current_strategy()  # a step with no strategy.run trains on the current one
        if strategy is not None and strategy is not self._last_strategy and self.on_training_strategy is not None:
            self._last_strategy = strategy
            self.on_training_strategy(strategy)
        self._emit(flags["_name"], steps, step_time_s, wait_s / steps if measured_wait else None, losses, examples)
        # A record without its losses: they stay in the loss variables until the next training
        # step, and are read if training pauses first (read_unread_losses).
        self._unread = (flags, self.agent.global_step) if losses is None and "loss" in flags and not eagerly else None
        if not eagerly:
            self._arm(flags)

    def _arm(self, flags: dict[str, Any]) -> None:
        """After a general record of ``flags``: its next records take the steady path while
        nothing this one worked out changes (see record)."""
        acc = self.accumulator is not None and "acc" in flags
        if "acc_runs" in flags and acc:
            return  # its step count is in the accumulator: read after every call
        implicit = steps = flags.get("implicit_runs", 0)
        if steps <= 0:
            if "runs" in flags:
                return  # counted in the graph, not a fixed number a call
            steps = 1
        strategy = flags.get("strategy")
        last = self._last_strategy
        reads = self.pacer.last_reads(acc)
        if reads is None or "_read" not in flags or last is None or (strategy is not None and strategy is not last):
            return
        self._steady = (flags, self.trace.generation, implicit if acc else 0, steps, "loss" in flags, *reads)

    def first_strategy_if_none(self) -> None:
        """A step trained on the current strategy: announced if no step has named one yet."""
        if self._last_strategy is None and self.on_training_strategy is not None:
            self._last_strategy = strategy = _current_strategy()
            self.on_training_strategy(strategy)

    def start_eager_function(self) -> None:
        """A top-level tf.function call is about to run eagerly (``tf.config.run_functions_eagerly``)."""
        self.eager_function.start()
        self.eager_losses = {}

    def read_unread_losses(self, now: float | None = None) -> None:
        """Training paused (evaluation began, an epoch or the script ended): the last step's
        losses, if its record went without them, are read now and sent for that step. With
        ``now``, only if a read is due anyway (at most one every ``pacer.every_s``)."""
        unread = self._unread
        if unread is None or self.loss_reader is None:
            return
        if now is not None and not self.pacer.pause_read_due(now):
            return
        self._unread = None
        flags, step = unread
        losses = self.loss_reader(flags)
        if losses:
            self.pacer.paused_read(self.perf())
            agent = self.agent
            agent.emit(StepLoss(t=agent.clock(), step=step, loss=sum(losses) / len(losses), replica_losses=losses))

    def _emit(
        self,
        fn_name: str,
        steps: int,
        step_time_s: float,
        wait_s: float | None,
        losses: tuple[float, ...] | None,
        examples: int | None,
    ) -> None:
        agent = self.agent
        agent.global_step += steps
        self.eager_wait_s = 0.0
        self.eager_examples = None
        self.eager_loop.stepped()
        loss = None
        if losses:
            loss = sum(losses) / len(losses)
            self.last_loss = (agent.global_step, loss, len(losses))
        # Only the Step's values here; the Step itself is built on the agent's thread (emit_step):
        # a frozen dataclass of 10 fields costs a microsecond the training thread need not spend.
        now = agent.clock()
        agent.emit_step(step_values(step=agent.global_step, t=now, step_time_s=step_time_s, input_wait_s=wait_s,
                                    loss=loss, replica_losses=losses or (), steps=steps, examples=examples,
                                    function=fn_name, epoch=getattr(self.epoch_source, "epoch", None)))
        phases = agent.phases
        if phases.pending or phases.current != "training":  # one compare a step; a message on change
            phases.on_step(fn_name, now - step_time_s * steps)
        if examples and self._config_batch is None:
            self._config_batch = examples
            agent.emit(Config(t=agent.clock(), global_batch_size=examples))

    # --- the explicit API (tpuwatch.step) ---------------------------------------------------

    @contextlib.contextmanager
    def manual_step(self, info: Any) -> Iterator[None]:
        """One step marked by the script; automatic detection is suspended inside it."""
        agent = self.agent
        if self.trace.current_top is not None or self.strategy_run.depth:
            yield  # nested inside a step already being measured
            return
        if agent.has_pending:
            agent.safe_point()
        self.trace.current_top = _MANUAL
        start = self.perf()
        try:
            yield
        finally:
            self.trace.current_top = None
        elapsed = self.perf() - start
        try:
            losses = tuple(float(v) for v in (info.replica_losses or ()))
            if not losses and info.loss is not None:
                losses = (float(info.loss),)
            wait = self.eager_wait_s
            self.eager_examples = info.examples if info.examples is not None else self.eager_examples
            self._emit("tpuwatch.step", 1, elapsed + wait, wait if wait > 0 else None, losses or None,
                       self.eager_examples)
        except Exception as e:
            agent.probe_failed("steps", e)


class _Manual:
    """Stands for the script's own step in ``TraceFlags.current_top`` (see manual_step)."""


_MANUAL = _Manual()


def _initialising_wrapper(graph: Any) -> bool:
    """``graph`` is the branch of the ``cond`` TF wraps a function in when its first call made
    variables whose initial values TF cannot lift out (``fn_with_cond`` in
    ``polymorphic_function.Function._call``, TF 2.16-2.21): the function's second trace, the one
    every later call runs, is made inside it. (The TPU guide's loop with a lazily built optimizer
    on TF 2.16: its steps were counted twice.)"""
    return bool(getattr(graph, "is_control_flow_graph", False)) and \
        getattr(getattr(graph, "outer_graph", None), "name", None) == "fn_with_cond"


def current_graph() -> Any:
    """The graph being built now, or None when executing eagerly."""
    from tensorflow.python.eager import context
    from tensorflow.python.framework import ops

    return None if context.executing_eagerly() else ops.get_default_graph()


def _functions_eagerly_switch() -> Any:
    """The module holding ``tf.config.run_functions_eagerly``'s switch (read per call: a module
    attribute)."""
    try:
        from tensorflow.python.eager.polymorphic_function import eager_function_run

        if isinstance(getattr(eager_function_run, "RUN_FUNCTIONS_EAGERLY", None), bool):
            return eager_function_run
    except ImportError:
        pass

    class _Never:
        RUN_FUNCTIONS_EAGERLY = False

    return _Never


def _outside_strategy_run() -> bool:
    """No ``strategy.run`` is running this code: no strategy at all, or cross-replica context."""
    from tensorflow.python.distribute import distribute_lib

    ctx = distribute_lib.get_replica_context()
    return ctx is None or ctx is distribute_lib._get_default_replica_context()


def _current_strategy() -> Any:
    import tensorflow as tf

    return tf.distribute.get_strategy()


def _name_of(fn: Any) -> str:
    try:
        return str(fn.__name__)
    except Exception:
        return "tf.function"


def _variables_of(sources: Any) -> tuple[int, ...]:
    """Ids of the first and last of ``tape.gradient``'s sources if any of them is not a plain
    tensor (a variable: tf's, Keras 3's, distributed), else ``()``: a gradient with respect to
    tensors only."""
    import tensorflow as tf

    plain = tf.Tensor
    flat = sources if isinstance(sources, list) and sources and not isinstance(sources[0], (list, tuple, dict)) \
        else tf.nest.flatten(sources)
    for s in flat:
        if not isinstance(s, plain):
            return (id(flat[0]), id(flat[-1]))
    return ()


def install(agent: "Agent", patches: "Patches") -> StepProbe:
    from tensorflow.python.eager import backprop
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    # A tpuwatch.step() loop may have made the probe before TensorFlow was imported: keep it.
    probe = agent.step_probe if isinstance(agent.step_probe, StepProbe) else StepProbe(agent)
    patches.wrap(polymorphic_function.Function, "__call__", probe.make_call_wrapper)

    def make_gradient(original: Callable[..., Any]) -> Callable[..., Any]:
        def gradient(tape: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                variables = _variables_of(args[1] if len(args) > 1 else kwargs.get("sources"))
                graph = current_graph()
                if graph is None and probe.trace.current_top is None and not probe.strategy_run.depth:
                    # An eager loop's gradient: with respect to tensors only (FGSM), it is no step.
                    if variables:
                        probe.trace.mark("training")
                        probe.eager_loop.gradient(variables)
                    else:
                        probe.eager_loop.probe_gradient()
                else:
                    # Traced (or in an eager strategy.run, or a tf.function running eagerly),
                    # every gradient trains: a TPU embedding's is taken with respect to its activations.
                    probe.trace.mark("training")
                    if graph is not None:
                        if _outside_strategy_run():
                            probe.count_gradient_step(graph)
                    elif probe.eager_function.active and _outside_strategy_run():
                        probe.eager_function.gradient(variables)
                if probe.gradient_hooks:
                    target = args[0] if args else kwargs.get("target")
                    for hook in probe.gradient_hooks:
                        hook(target, bool(variables))
            except Exception as e:
                agent.probe_failed("steps", e)
            return original(tape, *args, **kwargs)

        return gradient

    def make_enter(original: Callable[..., Any]) -> Callable[..., Any]:
        def __enter__(tape: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                probe.eager_loop.tape_entered(tape)
            except Exception as e:
                agent.probe_failed("steps", e)
            return original(tape, *args, **kwargs)

        return __enter__

    patches.wrap(backprop.GradientTape, "gradient", make_gradient)
    patches.wrap(backprop.GradientTape, "__enter__", make_enter)
    _install_updates(agent, patches, probe)
    return probe


#: Optimizer methods that update the variables (the outermost call of an eager update ends a step
#: of a loop with no tf.function): Keras 3's ``apply`` (``apply_gradients`` calls it), tf_keras'
#: ``apply_gradients`` (``minimize`` calls it), each loss-scale optimizer's own.
UPDATE_METHODS = (
    ("keras.src.optimizers.base_optimizer", ("BaseOptimizer",), "apply"),
    ("keras.src.optimizers.loss_scale_optimizer", ("LossScaleOptimizer",), "apply"),
    ("tf_keras.src.optimizers.optimizer", ("_BaseOptimizer", "Optimizer"), "apply_gradients"),
    ("tf_keras.src.optimizers.legacy.optimizer_v2", ("OptimizerV2",), "apply_gradients"),
    ("tf_keras.src.mixed_precision.loss_scale_optimizer", ("LossScaleOptimizer", "LossScaleOptimizerV3"),
     "apply_gradients"),
)


def _install_updates(agent: "Agent", patches: "Patches", probe: StepProbe) -> None:
    """Patches each class's own update method when the script imports its module."""
    from tpuwatch.agent import post_import

    def patcher(class_names: tuple[str, ...], method: str) -> Callable[[Any], None]:
        def patch(module: Any) -> None:
            for name in class_names:
                cls = getattr(module, name, None)
                if cls is not None and method in vars(cls):
                    patches.wrap(cls, method, probe.eager_loop.make_update_wrapper)

        return patch

    for module, class_names, method in UPDATE_METHODS:
        post_import.when_imported(module, patcher(class_names, method), lambda e: agent.probe_failed("steps", e))

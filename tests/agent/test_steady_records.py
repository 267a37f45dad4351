"""The step probe's steady records: a loop's record that reads nothing takes a short path on the
training thread. It must give exactly what the general path gives: the same Steps (steps, times,
waits, losses, examples), the same reads at the same records, the same held-back loss.

The probe is driven record by record, as the call wrapper drives it, with clocks that advance by
fixed amounts (no TensorFlow: the flags are what a trace leaves, the losses a reader's). Two probes
are fed the same run, one of them never taking the short path, and everything they emit compared.
"""

from __future__ import annotations

from typing import Any

import pytest

from tpuwatch.agent.accumulator import EXAMPLES, FETCHES, RUNS, SLOTS, WAIT_S
from tpuwatch.agent.runtime import Agent
from tpuwatch.agent.steps import StepProbe


class _Fn:
    """A tf.function stand-in: a weak-referenceable key for the probe's flags."""


class _Strategy:
    pass


class _Run:
    """One probe and what it emitted and read."""

    def __init__(self, tmp_path, general_only: bool) -> None:
        self.now = 1000.0
        tmp_path.mkdir()
        self.agent = Agent(tmp_path, "t", clock=lambda: self.now)
        probe = self.probe = StepProbe(self.agent)
        self.agent.step_probe = probe
        # The clocks: a step takes what call() says, a read 0.5 ms (which makes the steady pace
        # twice the least one: 0.5 ms is more than 0.1 % of 0.25 s of training).
        probe.perf = lambda: self.now
        self.reads: list[int] = []
        self.late_failures = 3
        self.general: list[int] = []  # the global step after each record the general path made

        def read(flags: dict[str, Any]) -> tuple[float, ...] | None:
            if "loss" not in flags:
                return None
            self.reads.append(self.agent.global_step)
            self.now += 0.0005
            if len(self.reads) == 259:  # a read that got nothing: tried again at the next record
                return None
            if flags is self.probe.trace.flags.get(self.late_fn) and self.late_failures:
                self.late_failures -= 1
                return None  # a function whose losses could not be read at first
            return (0.5 + self.agent.global_step, 1.5 + self.agent.global_step)

        probe.loss_reader = read
        self.strategies: list[int] = []  # the global step at each strategy announced as training's
        probe.on_training_strategy = lambda strategy: self.strategies.append(self.agent.global_step)
        # The in-graph accumulator: each step fetched its batch in the graph (64 examples, a wait
        # that grows with the step number); read as a list, as the probe reads the variable.
        self.fetched = [0.0] * SLOTS
        self.acc_reads: list[int] = []
        probe.accumulator = "variable"

        def read_accumulator() -> Any:
            self.acc_reads.append(self.agent.global_step)
            values = list(self.fetched)
            return type("Values", (), {"tolist": lambda _: values})()

        probe.read_accumulator = read_accumulator
        arm = probe._arm

        def counted_arm(flags: dict[str, Any]) -> None:
            self.general.append(self.agent.global_step)
            if not general_only:
                arm(flags)

        probe._arm = counted_arm  # type: ignore[method-assign]
        self.strategy = _Strategy()
        self.step_fn, self.other_fn, self.late_fn, self.eval_fn = _Fn(), _Fn(), _Fn(), _Fn()
        # Steps whose batch is fetched eagerly before the call (the tutorial's loop): one training
        # step a call, no in-graph fetch; two a call (a step unrolled twice); two a call with an
        # in-graph fetch too (its second batch fetched inside).
        self.eager_fns = {"one": _Fn(), "two": _Fn(), "two_acc": _Fn()}
        training = {"training": True, "runs": True, "implicit_runs": 1, "loss": "slot", "strategy": self.strategy,
                    "acc": True}
        no_acc = {k: v for k, v in training.items() if k != "acc"}
        for fn, flags, name in ((self.step_fn, training, "train_step"), (self.other_fn, training, "warmup_step"),
                                (self.late_fn, training, "finetune_step"), (self.eval_fn, {}, "test_step"),
                                (self.eager_fns["one"], no_acc, "distributed_train_step"),
                                (self.eager_fns["two"], {**no_acc, "implicit_runs": 2}, "unrolled_step"),
                                (self.eager_fns["two_acc"], {**training, "implicit_runs": 2}, "half_fetched_step")):
            for key, value in flags.items():
                probe.trace.flag(fn, key, value)
            probe.trace.flags.setdefault(fn, {})["_name"] = name

    def call(self, fn: _Fn, call_s: float) -> None:
        """A top-level call of ``fn`` that took ``call_s``, recorded as the call wrapper does."""
        self.now += call_s
        flags = self.probe.trace.flags[fn]
        if "training" in flags and "acc" in flags:
            step = self.agent.global_step
            self.fetched[WAIT_S] += 0.0001 * (step % 5)
            self.fetched[FETCHES] += 1
            self.fetched[EXAMPLES] += 64
            assert self.fetched[RUNS] == 0  # its steps are counted without the accumulator
        if "training" in flags:
            self.probe.record(flags, call_s, self.now)
        else:
            self.probe.read_unread_losses(self.now)

    def emitted(self) -> list[Any]:
        return list(self.agent._buf)


def _drive(run: _Run) -> None:
    """A run: its first 256 records (read as often as their budget allows), a steady stretch with
    eager fetches between steps and another function's first call, a retrace that changes the
    function's flags (another strategy), an evaluation pause, steps whose time varies, and a third
    function whose first reads get nothing."""
    for i in range(300):
        run.call(run.step_fn, 0.002 + 0.0001 * (i % 7))
    for i in range(200):
        if i in (20, 81, 150):  # a batch fetched eagerly between two steps
            run.probe.eager_wait_s, run.probe.eager_examples = 0.0005, 64
        if i == 130:  # one fetched eagerly, too fast to time
            run.probe.eager_examples = 64
        if i == 100:  # one fetched eagerly with no examples counted (a generator's)
            run.probe.eager_wait_s = 0.0004
        if i == 60:
            # Another training function's first call: its losses are read (its first record), the
            # accumulator only when due: the two reads' paces part.
            run.call(run.other_fn, 0.003)
        run.call(run.step_fn, 0.003)
    run.probe.trace.flag(run.step_fn, "strategy", _Strategy())  # retraced under another strategy
    for _ in range(200):
        run.call(run.step_fn, 0.003)
    run.now += 5.0  # an evaluation: its first call may read the held-back loss (the wall clock's pace)
    run.call(run.eval_fn, 0.1)
    for _ in range(400):
        run.call(run.step_fn, 0.001)
    for _ in range(300):  # another step function, whose first reads got nothing
        run.call(run.late_fn, 0.002)


def test_a_steady_record_emits_what_the_general_path_would(tmp_path):
    fast, general = _Run(tmp_path / "a", general_only=False), _Run(tmp_path / "b", general_only=True)
    _drive(fast)
    _drive(general)
    assert fast.agent.global_step == general.agent.global_step == 1401
    assert fast.reads == general.reads
    assert fast.acc_reads == general.acc_reads
    # the first, the retrace's, and the first again (the third function's)
    assert fast.strategies == general.strategies and len(fast.strategies) == 3
    assert len(fast.reads) > 10  # the pace read the losses now and then, not at every record
    assert fast.emitted() == general.emitted()
    for run in (fast, general):  # the last step's losses held back, for the same step
        assert run.probe._unread == (run.probe.trace.flags[run.late_fn], 1401)
    assert fast.probe._acc_unread_steps == general.probe._acc_unread_steps
    assert fast.probe.pacer.trained_s == general.probe.pacer.trained_s  # added up alike, to the bit
    # The steady pace was the one a read's cost sets (0.5 s of training, not the least 0.25 s).
    assert fast.probe.pacer.pace_s > 1.5 * fast.probe.pacer.every_s
    # Past the first 256, the general path made only the records that read, and one or two after
    # each change (5 eager fetches, another function's call, a retrace, a third function).
    assert len(general.general) == 1401
    after = [step for step in fast.general if step >= 256]
    reads_after = {step for step in fast.reads + fast.acc_reads if step >= 256}
    assert len(after) <= len(reads_after) + 12, (after, sorted(reads_after))


@pytest.mark.parametrize("kind", ["one", "two", "two_acc"])
def test_a_loop_fetching_every_batch_eagerly_takes_the_steady_path(tmp_path, kind):
    """The tutorial's loop (``for batch in dist_dataset: train_step(batch)``): every step's batch is
    fetched eagerly, its wait and examples charged to the step's record. Past the first records,
    only the records that read take the general path, and every record says what the general
    path would: the wait and the examples of its own fetch (per step where a call runs two)."""
    fast, general = _Run(tmp_path / "a", general_only=False), _Run(tmp_path / "b", general_only=True)
    fn = fast.eager_fns[kind]
    per_call = 2 if kind.startswith("two") else 1
    expected: dict[int, tuple[float | None, int | None]] = {}  # the global step before a call -> (wait, examples)
    for run in (fast, general):
        for i in range(4000):  # reads ~once a second of training past the first records: enough of them
            wait_s, examples = (0.0001, 0.0002, 0.0004)[i % 3], 64  # the fetch before each call, timed
            if i % 50 == 7:  # a batch whose size is not static: no examples counted
                examples = None
            if i % 40 == 11:  # a fetch too fast to time
                wait_s = 0.0
            if run is fast:
                expected[run.agent.global_step] = (wait_s / per_call if wait_s else None, examples)
            run.probe.eager_wait_s, run.probe.eager_examples = wait_s, examples
            run.call(run.eager_fns[kind], 0.002 + 0.0001 * (i % 5))
    assert fast.agent.global_step == general.agent.global_step == 4000 * per_call
    assert fast.reads == general.reads and len(fast.reads) > 10, fast.reads
    assert fast.acc_reads == general.acc_reads
    assert fast.emitted() == general.emitted()
    assert fast.probe.pacer.trained_s == general.probe.pacer.trained_s  # added up alike, to the bit
    assert fast.probe._acc_unread_steps == general.probe._acc_unread_steps
    assert fast.probe._unread == (fast.probe.trace.flags[fn], 4000 * per_call)
    assert general.probe._unread == (general.probe.trace.flags[general.eager_fns[kind]], 4000 * per_call)
    # The steady records, each with its own fetch's wait and examples.
    general_records = set(fast.general)  # the global step after each (its _arm runs after its Step)
    steady = [s for s in fast.emitted() if isinstance(s, tuple) and s[0] not in general_records]
    assert len(steady) > 1000
    assert all((s[3], s[7]) == expected[s[0] - s[6]] and s[6] == per_call for s in steady), steady[:5]
    first = 256 * per_call  # the steps of the run's first 256 records
    after = [step for step in fast.general if step > first]
    reads_after = {step for step in fast.reads + fast.acc_reads if step >= first}
    assert len(after) <= len(reads_after) + 2, (after, sorted(reads_after))

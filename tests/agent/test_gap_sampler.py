"""The gap sampler: another thread's stack, sampled from outside, charged to the script's line.

A real thread runs the work (this test file is the "script": it is under no library root) while
the test, as the agent's thread would, samples it. NumPy comes with TensorFlow (not with tpuwatch):
the tests that use it are marked ``tf``."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from tpuwatch.agent.gap_sampler import GapSampler
from tpuwatch.agent.runtime import Agent
from tpuwatch.protocol import HostSites


def _line_of(text: str) -> str:
    (n,) = [i for i, line in enumerate(open(__file__).read().splitlines(), start=1) if line.strip().startswith(text)]
    return f"test_gap_sampler.py:{n}"


def batches(rng, stop):
    import numpy as np

    while not stop.is_set():
        image = rng.random((96, 96, 3)).astype(np.float32)  # NumPy builds each batch
        yield image[::-1] * rng.uniform(0.8, 1.2) + rng.uniform(-0.1, 0.1)


def numpy_fed_loop(stop):
    import numpy

    rng = numpy.random.default_rng(0)
    for _batch in batches(rng, stop):  # the loop that consumes the generator
        pass


class WeightKeeper:
    def __init__(self):
        self.kept = []

    def on_train_batch_end(self, batch, logs=None):
        self.kept.append(sum(i * i for i in range(20_000)))  # the callback's Python, every batch


def callback_loop(stop):
    keeper = WeightKeeper()
    while not stop.is_set():
        keeper.on_train_batch_end(0)
        keeper.kept.clear()


def _sampled(tmp_path, target, n=60, state=lambda: "gap", step=None):
    agent = Agent(run_dir=tmp_path, run_id="t")
    stop = threading.Event()
    worker = threading.Thread(target=target, args=(stop,), daemon=True)
    worker.start()
    time.sleep(0.3)  # into its loop
    try:
        steps = itertools.count()  # a step between every two samples: each gap ends
        sampler = GapSampler(agent, state=state, step=step or (lambda: next(steps)), thread=worker.ident)
        for _ in range(n + 1):
            sampler.sample()
            time.sleep(0.002)
        (msg,) = sampler._message()
    finally:
        stop.set()
        worker.join(10)
        agent.stop()
    return sampler, msg


@pytest.mark.tf
def test_a_generator_building_batches_with_numpy_is_charged_to_its_line_and_its_consumer(tmp_path):
    _, msg = _sampled(tmp_path, numpy_fed_loop)
    assert isinstance(msg, HostSites) and msg.samples == 60 and msg.script_samples == 60
    rows = list(zip(msg.sites, msg.counts, msg.kinds, msg.roles, msg.functions, msg.callers))
    lines = {_line_of("image = rng.random((96, 96, 3))"), _line_of("yield image[::-1]")}
    in_generator = [r for r in rows if r[0] in lines]
    assert sum(r[1] for r in in_generator) >= 0.8 * msg.samples, rows
    for site, _n, kind, role, function, caller in in_generator:
        assert (role, function) == ("generator", "batches")
        assert caller == _line_of("for _batch in batches(rng, stop):")
        # NumPy's C functions leave no frame: a line that names np. is NumPy's work
        if site == _line_of("image = rng.random((96, 96, 3))"):
            assert kind == "numpy"


def test_a_callback_method_is_charged_as_the_callback_with_its_name(tmp_path):
    _, msg = _sampled(tmp_path, callback_loop)
    top = msg.sites[0]
    assert top == _line_of("self.kept.append(sum(i * i"), msg
    assert (msg.kinds[0], msg.roles[0], msg.functions[0]) == ("python", "callback", "WeightKeeper.on_train_batch_end")


def test_samples_during_a_step_or_outside_training_are_counted_never_charged(tmp_path):
    states = iter(["step", "off", "gap"] * 20 + ["gap"])
    sampler, msg = _sampled(tmp_path, callback_loop, state=lambda: next(states))
    assert (msg.samples, msg.step_samples) == (20, 20)
    assert sum(msg.counts) == msg.script_samples == 20


def test_unchanged_counts_send_nothing_and_the_end_sends_the_last_ones(tmp_path):
    sampler, msg = _sampled(tmp_path, callback_loop, n=10)
    assert sampler._message() == []  # nothing new since
    agent = sampler.agent
    sampler.samples += 1
    sampler.close()
    assert [m.samples for m in agent._buf if isinstance(m, HostSites)] == [11]


def test_the_samples_after_the_last_step_are_not_time_between_steps(tmp_path):
    # 5 samples in the gap a step ended, then 6 after the last step (fit's teardown, the script's
    # end): the ledger books those as finishing, and so does the sampler
    steps = iter([1] * 5 + [2] * 6)
    sampler, msg = _sampled(tmp_path, callback_loop, n=10, step=lambda: next(steps))
    assert msg.samples == 5 and sum(msg.counts) == 5
    sampler.close()
    assert not [m for m in sampler.agent._buf if isinstance(m, HostSites)]  # nothing new to send


@pytest.mark.tf
def test_the_fetch_of_the_next_batch_from_tf_data_is_not_the_scripts_time(tmp_path):
    # a custom loop's `for batch in dataset`: the time in tf.data's iterator is input, never a
    # line of the script's to change (a healthy 1,500-step loop got a host-bound warning at its
    # `for` line before)
    import tensorflow as tf

    ds = tf.data.Dataset.range(10**9).map(lambda x: tf.reduce_sum(tf.ones((64, 64)) * tf.cast(x, tf.float32)))

    def loop(stop):
        for _batch in ds:
            if stop.is_set():
                break

    _, msg = _sampled(tmp_path, loop)
    assert msg.samples == 60 and msg.script_samples <= 12, msg


class _Keeper:
    def on_train_batch_end(self, batch):
        return (i * i for i in range(batch))


def test_a_generator_expression_sampled_after_it_paused_is_charged_to_the_method_it_is_written_in():
    # The agent's thread reads a frame the training thread has moved on from: a generator
    # expression that paused (or ended) has no caller frame any more, so the walk outward found
    # no callback: 'loop', 'WeightKeeper.on_train_batch_end.<locals>.<genexpr>' (1 run in 6)
    from tpuwatch.agent.gap_sampler import role_of
    from tpuwatch.agent.script_frames import library_roots

    gen = _Keeper().on_train_batch_end(10)
    next(gen)
    frame = gen.gi_frame
    assert frame.f_back is None
    assert role_of(frame, library_roots()) == ("callback", "_Keeper.on_train_batch_end", "_Keeper.on_train_batch_end")


def _looks_in_a_second(tmp_path, state: str) -> int:
    """The looks the agent's thread takes in one second (at its own rate of 4) at a training thread
    always found in ``state``."""
    from tpuwatch.agent import gap_sampler

    agent = Agent(run_dir=tmp_path, run_id="t", sample_hz=4)
    stop = threading.Event()
    worker = threading.Thread(target=callback_loop, args=(stop,), daemon=True)
    worker.start()
    sampler = gap_sampler.install(agent, None)  # type: ignore[arg-type]  (it patches nothing)
    steps = itertools.count()
    sampler._state, sampler._step, sampler._thread = (lambda: state), (lambda: next(steps)), worker.ident
    agent.start()
    try:
        time.sleep(1.0)
    finally:
        agent.stop()
        stop.set()
        worker.join(10)
    assert agent.sample_interval_s == 0.25
    return sampler.samples + sampler.step_samples


def test_the_agent_looks_between_steps_20_times_a_second_whatever_its_own_rate(tmp_path):
    # At the agent's 4 Hz, 1.5 s between steps over a 300-step fit (a callback reading the weights
    # every batch) gave 1 to 7 samples: the host-bound rule, which wants 4 with half of them in
    # the script, named the callback in some runs and said nothing in others.
    looks = _looks_in_a_second(tmp_path, "gap")
    assert looks >= 12, looks  # 20 expected; 4 at the agent's own rate


def test_a_training_thread_found_in_its_steps_is_looked_at_at_the_agents_own_rate(tmp_path):
    # Each wake of the agent's thread costs ~125 µs of CPU here: 16 more a second cost a 27 ms
    # step ~60 µs of the agent thread's CPU. Where the looks find steps under way (a healthy run)
    # there is no host time to locate.
    looks = _looks_in_a_second(tmp_path, "step")
    assert looks <= 8, looks  # 4 expected; 20 at the fast rate


def test_the_interval_it_reports_is_the_spacing_of_its_samples_between_steps(tmp_path):
    # Its pace changes with what it finds: a fixed figure (the fast one, or the agent's) would be
    # wrong for most runs' evidence, and so would the mean over every look (4 a second in steps).
    times = iter([10.0, 10.25, 10.5, 10.55, 10.6, 10.85])
    states = iter(["off", "step", "gap", "gap", "gap", "step"])
    agent = Agent(run_dir=tmp_path, run_id="t", sample_hz=4)
    steps = itertools.count()
    sampler = GapSampler(agent, state=lambda: next(states), step=lambda: next(steps), clock=lambda: next(times))
    for _ in range(6):
        sampler.sample()
    (msg,) = sampler._message()
    assert msg.samples == 3 and msg.sample_interval_s == 0.1167  # (0.25 + 0.05 + 0.05) / 3

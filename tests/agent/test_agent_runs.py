"""The agent inside real TensorFlow training (4 replicas on logical CPU devices), end to end."""

from __future__ import annotations

import re
import signal
import statistics

import pytest

from tpuwatch import protocol
from tpuwatch_testing import SCRIPTS

pytestmark = pytest.mark.tf
LOOPS = SCRIPTS / "loops.py"


def _reduced(path) -> dict[int, float]:
    out = {}
    for line in path.read_text().splitlines():
        step, value = line.split(",")
        out[int(step)] = float(value)
    return out


def _wait_share(run, skip: int = 2) -> float:
    steps = run.steps[skip:]  # the first calls trace and compile
    assert steps, run.output
    return sum(s.input_wait_s for s in steps) / sum(s.step_time_s for s in steps)


@pytest.mark.parametrize("mode", ["custom", "fit", "iterator_fn", "eager_run"])
def test_per_replica_losses_average_to_the_reduced_loss(run_agent, tmp_path, mode):
    log = tmp_path / "reduced.txt"
    extra = ["--epochs", "2"] if mode == "fit" else []
    run = run_agent(LOOPS, "--mode", mode, "--steps", "8", "--loss-log", str(log), *extra)
    assert run.returncode == 0, run.output
    reduced = _reduced(log)
    steps = run.steps
    assert [s.step for s in steps] == list(range(1, 9))
    assert steps[-1].step == len(reduced) == 8
    for s in steps:
        assert len(s.replica_losses) == 4
        assert s.loss == pytest.approx(statistics.fmean(s.replica_losses), rel=1e-6)
        # fit's value is derived from Keras' float32 running mean, hence its looser bound.
        assert s.loss == pytest.approx(reduced[s.step], rel=1e-5 if mode != "fit" else 2e-5), (s.step, s, reduced)
        assert s.examples == 64
        assert s.step_time_s > 0
    assert not run.warnings, run.warnings


@pytest.mark.parametrize("mode", ["fit", "custom"])
def test_legacy_keras_2_per_replica_losses_and_epochs(run_agent, tmp_path, mode):
    """tf-keras (Keras 2) under TF_USE_LEGACY_KERAS=1: its own loss hook and callbacks."""
    log = tmp_path / "reduced.txt"
    run = run_agent(LOOPS, "--mode", mode, "--steps", "6", "--loss-log", str(log), env={"TF_USE_LEGACY_KERAS": "1"})
    assert run.returncode == 0, run.output
    reduced = _reduced(log)
    assert [s.step for s in run.steps] == list(range(1, 7))
    for s in run.steps:
        assert len(s.replica_losses) == 4
        assert s.loss == pytest.approx(reduced[s.step], rel=1e-5 if mode != "fit" else 2e-5)
    if mode == "fit":
        assert [(e.epoch, e.phase) for e in run.of(protocol.Epoch)] == [(0, "begin"), (0, "end")]
    assert not run.warnings, run.warnings


def test_several_steps_per_call_are_counted_in_graph(run_agent, tmp_path):
    log = tmp_path / "reduced.txt"
    run = run_agent(LOOPS, "--mode", "iterator_fn", "--per-call", "3", "--steps", "9", "--loss-log", str(log))
    assert run.returncode == 0, run.output
    assert [(s.step, s.steps) for s in run.steps] == [(3, 3), (6, 3), (9, 3)]
    assert all(len(s.replica_losses) == 4 for s in run.steps)


def test_default_strategy_plain_dataset(run_agent):
    run = run_agent(LOOPS, "--mode", "default", "--steps", "6")
    assert run.returncode == 0, run.output
    assert [s.step for s in run.steps] == list(range(1, 7))
    assert all(len(s.replica_losses) == 1 for s in run.steps)
    assert all(s.input_wait_s is not None for s in run.steps)


@pytest.mark.parametrize("mode", ["fit", "custom"])
def test_input_wait_separates_a_starved_pipeline_from_a_fast_one(run_agent, mode):
    # A 4-replica eager fetch costs ~2 ms even when the data is ready, and 8-13 ms on a loaded
    # 2-core box: no starvation at realistic step times, so the fast run's steps are ~50-200 ms
    # (2,048 units; at 1,024 units a CI box's ~16 ms steps spent 20 % in that fetch). The slow
    # pipeline takes 400 ms a batch, well beyond its ~20-60 ms steps even on a loaded box (at
    # 200 ms, steps slowed to ~150-200 ms by load left almost no wait), so prefetching cannot
    # hide it. While the first step compiles, the distributed iterator buffers a batch per
    # device (4 here), so the slow run is judged after those: its steady state.
    slow = run_agent(LOOPS, "--mode", mode, "--input", "slow", "--sleep-ms", "400", "--steps", "16", "--width", "1024")
    fast = run_agent(LOOPS, "--mode", mode, "--input", "fast", "--steps", "14", "--width", "2048")
    assert slow.returncode == 0 and fast.returncode == 0, slow.output + fast.output
    assert _wait_share(slow, skip=8) > 0.5, [(s.step_time_s, s.input_wait_s) for s in slow.steps]
    assert _wait_share(fast) < 0.2, [(s.step_time_s, s.input_wait_s) for s in fast.steps]


def test_sampled_in_graph_input_wait_keeps_the_share(run_agent):
    """Where a call's step count needs no read (fit's step on one batch), fit's in-graph input wait
    is read like the losses, at most every TPUWATCH_LOSS_EVERY_S: records between reads carry
    none, and a read spreads the wait since the last one over those steps, so the share holds."""
    run = run_agent(LOOPS, "--mode", "fit", "--input", "slow", "--sleep-ms", "400", "--steps", "16",
                    "--width", "1024", env={"TPUWATCH_LOSS_EVERY_S": "1.0"})
    assert run.returncode == 0, run.output
    assert sum(s.steps for s in run.steps) == 16
    steady = run.steps[8:]
    measured = [s for s in steady if s.input_wait_s is not None]
    assert 0 < len(measured) < len(steady), [s.input_wait_s for s in run.steps]
    assert sum(s.input_wait_s for s in measured) / sum(s.step_time_s for s in measured) > 0.5, \
        [(s.step_time_s, s.input_wait_s) for s in run.steps]


def test_losses_are_sampled_by_step_time_in_an_input_bound_loop(run_agent):
    """Reads are paced by training time, which includes the wait for the next batch: a loop whose
    2 ms steps wait ~60 ms each for an eagerly fetched batch is still read ~every 0.1 s of it (every
    second step), not every 50 steps (its calls alone add up to 0.1 s only that rarely)."""
    run = run_agent(LOOPS, "--mode", "custom", "--input", "slow", "--sleep-ms", "60", "--steps", "30",
                    env={"TPUWATCH_LOSS_EVERY_S": "0.1"})
    assert run.returncode == 0, run.output
    assert sum(s.steps for s in run.steps) == 30
    read = [s for s in run.steps if s.replica_losses]
    # Steady steps take >= 60 ms: at least one read every 2 steps (about 15); allow half.
    assert len(read) >= 8, [(round(s.step_time_s, 3), bool(s.replica_losses)) for s in run.steps]


def test_retraces_of_ragged_batches_name_the_shape(run_agent):
    run = run_agent(LOOPS, "--mode", "custom", "--ragged", "--steps", "8")
    assert run.returncode == 0, run.output
    traces = [r for r in run.of(protocol.Retrace) if r.function == "train_step"]
    assert len(traces) >= 4  # four distinct batch sizes
    # Per-replica shapes: 64, 56, 48, 40 examples over 4 replicas.
    assert any("x: shape (16, 8) -> (14, 8)" in r.change for r in traces), [r.change for r in traces]


def test_static_loop_traces_its_step_once(run_agent):
    run = run_agent(LOOPS, "--mode", "custom", "--steps", "8")
    assert run.returncode == 0, run.output
    assert len([r for r in run.of(protocol.Retrace) if r.function == "train_step"]) == 1


def test_python_float_argument_is_reported_as_the_cause(run_agent):
    run = run_agent(LOOPS, "--mode", "custom", "--float-arg", "--steps", "4")
    assert run.returncode == 0, run.output
    changes = [r.change for r in run.of(protocol.Retrace) if r.function == "train_step"][1:]
    assert changes and all("lr" in c and "0.005" in c for c in changes[:1]), changes


@pytest.mark.usefixtures("sigint_default")  # the script kills itself by SIGINT
def test_exit_codes_and_the_traceback_are_recorded(run_agent):
    ok = run_agent(SCRIPTS / "exits.py")
    assert ok.returncode == 0 and ok.of(protocol.Exit)[-1].exit_code == 0
    assert len(ok.steps) == 3

    failed = run_agent(SCRIPTS / "exits.py", "--raise")
    assert failed.returncode == 1
    exc = failed.of(protocol.ExceptionRaised)
    assert exc and exc[0].type == "ValueError" and "planted failure" in exc[0].traceback
    assert "exits.py" in exc[0].traceback
    assert failed.of(protocol.Exit)[-1].exit_code == 1
    assert "planted failure" in failed.output  # the traceback still reaches stderr

    exited = run_agent(SCRIPTS / "exits.py", "--exit", "7")
    assert exited.returncode == 7 and exited.of(protocol.Exit)[-1].exit_code == 7

    interrupted = run_agent(SCRIPTS / "exits.py", "--signal", "SIGINT")
    assert interrupted.returncode == -signal.SIGINT
    last = interrupted.of(protocol.Exit)[-1]
    assert (last.exit_code, last.signal) == (128 + signal.SIGINT, signal.SIGINT)


def test_a_failing_probe_is_disabled_once_and_training_is_unaffected(run_agent, tmp_path):
    log = tmp_path / "reduced.txt"
    run = run_agent(LOOPS, "--mode", "custom", "--steps", "6", "--loss-log", str(log),
                    env={"TPUWATCH_TEST_FAIL_PROBE": "replica_loss"})
    assert run.returncode == 0, run.output
    assert len(_reduced(log)) == 6 and "done 6 steps" in run.output
    warnings = [e for e in run.warnings if e.source == "probe:replica_loss"]
    assert len(warnings) == 1 and "disabled" in warnings[0].message
    assert [s.step for s in run.steps] == list(range(1, 7))
    assert all(s.replica_losses == () for s in run.steps)


def test_the_explicit_step_api_marks_steps_the_patches_cannot_see(run_agent):
    run = run_agent(SCRIPTS / "manual.py")
    assert run.returncode == 0, run.output
    assert [(s.step, s.function, s.examples) for s in run.steps] == [(i, "tpuwatch.step", 32) for i in range(1, 6)]
    assert run.steps[0].loss == 0.0 and run.steps[1].loss == pytest.approx(0.81)


def test_explicit_steps_then_a_step_function_count_each_step_once(run_agent):
    """A tpuwatch.step() loop's gradients are the script's own steps: they were also counted
    as the steps of the first tf.function call after them (4 + 4 + 2 = 10 for 7)."""
    run = run_agent(SCRIPTS / "manual_then_function.py")
    assert run.returncode == 0, run.output
    assert "ran 7 steps" in run.output
    assert [(s.step, s.function, s.steps) for s in run.steps] == (
        [(i, "tpuwatch.step", 1) for i in range(1, 5)] + [(i, "train_step", 1) for i in range(5, 8)])


def test_the_explicit_step_api_works_in_a_script_that_never_imports_tensorflow(run_agent):
    """The tryout: README's pure-Python ``tpuwatch.step`` loop ended with "no training step
    recorded" unless the script imported TensorFlow (the step probe was made at that import)."""
    run = run_agent(SCRIPTS / "manual_no_tf.py")
    assert run.returncode == 0, run.output
    printed = [float(v) for v in re.findall(r"step \d+ loss (\S+)", run.output)]
    assert [(s.step, s.function, s.examples) for s in run.steps] == [(i, "tpuwatch.step", 16) for i in range(1, 7)]
    assert [s.loss for s in run.steps] == printed


def test_the_explicit_step_api_is_inert_without_the_agent():
    import tpuwatch

    with tpuwatch.step(examples=4) as s:
        s.loss = 1.0
    assert s.examples == 4


def test_the_agent_adds_no_trace_of_its_own(run_agent, tmp_path):
    """Probe variables made inside the first trace would make TF trace the step function twice
    (doubling compile time on a TPU): they are made before it instead."""
    counter = tmp_path / "count_traces.py"
    counter.write_text(
        "import runpy, sys\n"
        "import tensorflow as tf\n"
        "from tensorflow.python.eager.polymorphic_function import tracing_compilation as tc\n"
        "original, names = tc._create_concrete_function, []\n"
        "def counting(function_type, type_context, func_graph, options):\n"
        "    names.append(options.name)\n"
        "    return original(function_type, type_context, func_graph, options)\n"
        "tc._create_concrete_function = counting\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
        # Keras < 3.4 names fit's step function one_step_on_iterator when steps_per_execution is 1.
        "print('TRACES', names.count('train_step'),\n"
        "      names.count('multi_step_on_iterator') + names.count('one_step_on_iterator'))\n")
    custom = run_agent(counter, str(LOOPS), "--mode", "custom", "--steps", "4")
    fit = run_agent(counter, str(LOOPS), "--mode", "fit", "--steps", "4")
    assert "TRACES 1 0" in custom.output and len(custom.steps) == 4, custom.output
    assert "TRACES 0 1" in fit.output and len(fit.steps) == 4, fit.output

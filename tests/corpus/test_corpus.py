"""Truth on scripts written the way TensorFlow's guides and users write them.

Each corpus script prints its own numbers (every training step's reduced loss where it can, its
step count otherwise). It runs under ``tpuwatch run --headless``, the way a user runs it, and the
recording must agree with what the script printed: steps counted = steps the script ran, the run
loss = the script's reduced loss (relative 1e-5), every replica's loss present and fresh, the
strategy that trained, the script's exit code, and the process gone within 15 s of the script's
last line.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tpuwatch import protocol
from tpuwatch_testing import child_env, read_messages

pytestmark = pytest.mark.tf

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@dataclass
class CorpusRun:
    returncode: int
    stdout: list[tuple[float, str]]  # (arrival time, line) of the script's own output
    stderr: str
    run_dir: Path

    @property
    def messages(self) -> list:
        path = self.run_dir / "events.jsonl"
        return read_messages(path) if path.exists() else []

    def of(self, cls) -> list:
        return [m for m in self.messages if isinstance(m, cls)]

    @property
    def steps(self) -> list:
        return self.of(protocol.Step)

    def printed(self, pattern: str) -> list[tuple[str, ...]]:
        rx = re.compile(pattern)
        return [m.groups() for _, line in self.stdout for m in [rx.search(line)] if m]

    def report(self) -> dict:
        out = subprocess.run([sys.executable, "-m", "tpuwatch", "report", str(self.run_dir), "--format", "json"],
                             capture_output=True, text=True, timeout=120, env=child_env())
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def describe(self) -> str:
        return "\n".join(line for _, line in self.stdout[-30:]) + "\n" + self.stderr[-4000:]


def run_corpus(tmp_path: Path, script: str, *args: str, workers: int = 0, timeout: float = 240,
               env: dict | None = None) -> CorpusRun:
    run_dir = tmp_path / f"run-{script.removesuffix('.py')}"
    cmd = [sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(run_dir)]
    if workers:
        cmd += ["--workers", str(workers)]
    cmd += [str(SCRIPTS / script), *args]
    # Every step's loss is read here (the default reads at most every 10 ms of training), so every
    # step can be checked; test_sampled_losses_carry_their_step checks the default.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=child_env(**{"TPUWATCH_LOSS_EVERY_S": "0", **(env or {})}))
    lines: list[tuple[float, str]] = []
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    try:
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))
            assert time.monotonic() < deadline, "corpus script ran too long"
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(5)
    return CorpusRun(proc.returncode, lines, "".join(err), run_dir)


def assert_common(run: CorpusRun, *, steps: int, replicas: int, strategy: str = "MirroredStrategy") -> None:
    assert run.returncode == 0, run.describe()
    recorded = run.steps
    assert recorded and recorded[-1].step == steps, ([s.step for s in recorded], run.describe())
    assert sum(s.steps for s in recorded) == steps
    for s in recorded:
        assert len(s.replica_losses) == replicas, s
        assert s.loss == pytest.approx(statistics.fmean(s.replica_losses), rel=1e-6)
    # Fresh: every record carries its own loss (a frozen copy would repeat bit for bit).
    values = [s.replica_losses for s in recorded]
    assert len(set(values)) == len(values), values
    topologies = run.of(protocol.Topology)
    assert topologies[-1].strategy.endswith(strategy) or topologies[-1].strategy == strategy, topologies
    assert not [e for e in run.of(protocol.Event) if e.level in ("warning", "error") and e.source.startswith("probe")], \
        run.of(protocol.Event)
    exits = run.of(protocol.Exit)
    assert exits and exits[0].exit_code == 0


def assert_losses_equal(run: CorpusRun, printed: dict[int, float]) -> None:
    recorded = {s.step: s.loss for s in run.steps}
    assert set(printed) == set(recorded), (sorted(printed), sorted(recorded))
    for step, value in printed.items():
        assert recorded[step] == pytest.approx(value, rel=1e-5), (step, recorded[step], value)


@pytest.mark.parametrize("reduction,replicas,extra", [
    ("sum", 4, ["--regularize"]),
    ("sum", 1, []),
    ("sum", 2, []),
    ("sum", 8, []),
    ("mean", 4, []),
    ("manual", 2, ["--regularize"]),
    ("sum", 2, ["--run-functions-eagerly"]),
    ("manual", 2, ["--run-functions-eagerly"]),
    ("mean", 1, ["--run-functions-eagerly"]),
], ids=lambda v: "".join(v) if isinstance(v, list) else None)
def test_tutorial_custom_loop_loss_is_the_scripts(tmp_path, reduction, replicas, extra):
    """compute_average_loss + SUM (the tutorial), plain MEAN, and a hand-scaled SUM; a test step per
    epoch (not counted) and a checkpoint per epoch. With ``tf.config.run_functions_eagerly(True)``
    (the tutorials' debugging switch) the loss showed "—" and the strategy "default strategy"."""
    run = run_corpus(tmp_path, "custom_loop_tutorial.py", "--replicas", str(replicas), "--reduction", reduction,
                     "--epochs", "2", "--batches", "4", *extra)
    printed = {int(step): float(loss) for step, loss in run.printed(r"train step (\d+) loss (\S+)")}
    assert len(printed) == 8
    assert_common(run, steps=8, replicas=replicas)
    assert_losses_equal(run, printed)
    # Each replica is shown with its own mean loss (a cross-entropy over 10 classes: ~2.3), not
    # its share of the global batch (1/N of that).
    assert all(1.5 < v < 3.5 for s in run.steps for v in s.replica_losses), [s.replica_losses for s in run.steps]


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
def test_mixed_precision_loop_shows_the_unscaled_loss(tmp_path, replicas, legacy):
    """The mixed-precision guide's loop takes the gradient of the loss times the loss scale (2**15
    at first); the loss shown is the one the step computes, not the scaled gradient target."""
    run = run_corpus(tmp_path, "mixed_precision_loop.py", "--replicas", str(replicas), "--steps", "6",
                     env={"TF_USE_LEGACY_KERAS": "1"} if legacy else None)
    printed = {int(step): float(loss) for step, loss in run.printed(r"step (\d+) loss (\S+)")}
    assert len(printed) == 6, run.describe()
    assert_common(run, steps=6, replicas=replicas,
                  strategy="MirroredStrategy" if replicas > 1 else "_DefaultDistributionStrategy")
    assert_losses_equal(run, printed)


@pytest.mark.parametrize("steps_per_call", [1, 4])
def test_tpu_guide_loop_that_returns_nothing(tmp_path, steps_per_call):
    """The replica function returns None and updates a Mean metric; steps run in a tf.range loop."""
    run = run_corpus(tmp_path, "tpu_guide_loop.py", "--calls", "3", "--steps-per-call", str(steps_per_call))
    assert_common(run, steps=3 * steps_per_call, replicas=4)
    assert [s.steps for s in run.steps] == [steps_per_call] * 3
    printed = [float(v) for (v,) in run.printed(r"training_loss (\S+)")]
    if steps_per_call == 1:  # the metric then holds exactly that step's loss
        if [s.loss for s in run.steps] != pytest.approx(printed, rel=1e-5):
            # Keras 3.3's metrics are not aggregated across MirroredStrategy replicas: the
            # script's Mean then reads replica 0's value alone (still each replica's own mean).
            assert [s.replica_losses[0] for s in run.steps] == pytest.approx(printed, rel=1e-5), (run.steps, printed)
    else:  # the metric is the mean of the call's steps; the record holds the call's last step
        assert all(abs(s.loss - p) / p < 0.25 for s, p in zip(run.steps, printed)), (run.steps, printed)


@pytest.mark.parametrize("loop, replicas, per_call, eagerly, counts", [
    ("tf.range", 4, 4, False, [4, 4, 2]),
    ("unrolled", 0, 4, False, [4, 4, 2]),  # a plain iterator: each fetch after the last one's count
    ("unrolled", 0, 1, False, [1] * 10),  # the call that raises trained nothing
    ("unrolled", 4, 4, True, [4, 4, 2]),  # run_functions_eagerly: next() raises StopIteration
    # a distributed iterator's fetches are left as built: the fetch that raises may abort the call
    # before the counts of the fetches before it are added (0, 1 or 2 of the last call's 2)
    ("unrolled", 4, 4, False, None),
], ids=["tf.range", "unrolled-plain", "one-a-call", "eagerly", "unrolled-distributed"])
def test_calls_until_the_data_runs_out_count_the_last_calls_steps(tmp_path, loop, replicas, per_call, eagerly,
                                                                  counts):
    """10 batches, 4 steps a call, called until the data runs out: the last call's steps are
    handed 2 batches and it raises at its third fetch. Those 2 steps were not counted before (8 of
    10). The optimizer's iterations are no measure: 11 and 12, its increment ran for steps whose
    fetch failed."""
    run = run_corpus(tmp_path, "tpu_guide_loop.py", "--batches", "10", "--steps-per-call", str(per_call),
                     "--replicas", str(replicas), *(["--unrolled"] if loop == "unrolled" else []),
                     *(["--eagerly"] if eagerly else []))
    assert run.returncode == 0, run.describe()
    ((batches, iterations),) = run.printed(r"(\d+) batches; optimizer iterations (\d+)")
    counted = [s.steps for s in run.steps]
    if counts is None:
        assert counted[:2] == [4, 4] and counted[2:] in ([], [1], [2]), run.steps
    else:
        assert counted == counts, run.steps
        assert sum(counted) == int(batches) <= int(iterations)
    assert all(s.examples == 16 * max(replicas, 1) for s in run.steps), run.steps


def test_a_step_of_two_fetches_is_counted_once_and_only_when_both_found_a_batch(tmp_path):
    """Each step fetches from two iterators (4 steps a call); the second runs out first: the last
    call's third step found its first batch and not its second, and never ran. Counted: 10, each
    step by its two fetches (4 + 4 + 2), not 11 (21 fetches rounded) nor 21."""
    run = run_corpus(tmp_path, "two_iterators_loop.py", "--batches", "11", "--noise-batches", "10")
    assert run.returncode == 0, run.describe()
    (both,) = [int(n) for (n,) in run.printed(r"(\d+) steps had both batches")]
    assert [s.steps for s in run.steps] == [4, 4, 2] and both == 10, run.steps
    # a step's examples are its two batches', the half step's batch left out
    assert all(s.examples == 16 for s in run.steps), run.steps


def test_epoch_loop_inside_one_function(tmp_path):
    """``for x in dist_dataset`` inside a tf.function: the examples probe must not break."""
    run = run_corpus(tmp_path, "epoch_in_function.py", "--epochs", "2", "--batches", "5")
    assert run.printed(r"epoch 2 batches (5)")
    assert_common(run, steps=10, replicas=4)
    assert [s.steps for s in run.steps] == [5, 5]
    assert all(s.examples == 32 for s in run.steps), run.steps


def _keras_version() -> tuple[int, ...]:
    """Keras' (major, minor), read at collection without importing it; (0,) where it is not
    installed (the fast lane's environment, where these tests do not run)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return tuple(int(part) for part in version("keras").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return (0,)


def test_fit_running_several_steps_a_call_counts_each_steps_examples(tmp_path):
    """``steps_per_execution=4`` on one device (8 batches an epoch): Keras fetches each batch
    inside its step function (3.4 and later with ``get_next_as_optional``, counted with no branch,
    which tests/agent/test_optional_examples.py checks in the graph). The steps counted are the
    ones the optimizer took, each with its batch's examples."""
    run = run_corpus(tmp_path, "fit_multi_step.py", "--steps-per-execution", "4", "--batches", "8", "--epochs", "2")
    assert run.returncode == 0, run.describe()
    (trained,) = run.printed(r"^trained (\d+) steps")[0]
    assert sum(s.steps for s in run.steps) == int(trained) == 16, (trained, run.steps)
    assert all(s.examples == 8 for s in run.steps), [(s.step, s.steps, s.examples) for s in run.steps]


def test_a_call_that_runs_out_of_data_counts_the_steps_it_ran(tmp_path):
    """10 batches an epoch, 4 a call: each epoch's last call runs out of data after 2 steps. Keras
    3.4 and later fetch an Optional (the empty one holds no examples); 3.3 unrolls 4 calls of
    next(iterator), and the one that finds no batch raises OutOfRangeError after 2 steps trained
    (those were not counted: 16 of 20). The steps counted are the batches, one step each; on 3.3
    the optimizer's iterations count more (22: the increment needs no batch)."""
    run = run_corpus(tmp_path, "fit_multi_step.py", "--steps-per-execution", "4", "--batches", "10", "--epochs", "2")
    assert run.returncode == 0, run.describe()
    (trained,) = run.printed(r"^trained (\d+) steps")[0]
    assert sum(s.steps for s in run.steps) == 20 <= int(trained), (trained, run.steps)
    if _keras_version() >= (3, 4):
        assert int(trained) == 20
    assert [s.steps for s in run.steps] == [4, 4, 2] * 2, run.steps
    assert all(s.examples == 8 for s in run.steps), [(s.step, s.steps, s.examples) for s in run.steps]


@pytest.mark.parametrize("eagerly", [False, True], ids=["graph", "run_functions_eagerly"])
def test_fit_with_validation_callbacks_and_a_reloaded_model(tmp_path, eagerly):
    """Validation and evaluation steps are not training steps; a model reloaded and evaluated
    outside the strategy's scope does not relabel the run. With ``run_functions_eagerly`` too
    (it showed no loss, and the default strategy)."""
    run = run_corpus(tmp_path, "fit_callbacks.py", "--epochs", "2", "--steps", "5", "--reload",
                     *(["--run-functions-eagerly"] if eagerly else []))
    assert run.printed(r"Reloaded eval loss")
    assert_common(run, steps=10, replicas=4)
    # Keras logs the running mean of the epoch's loss: each step's own loss follows from it.
    printed = _steps_from_running_means(run, 5)
    recorded = {s.step: s.loss for s in run.steps}
    for step, value in printed.items():
        assert recorded[step] == pytest.approx(value, rel=2e-5, abs=2e-5), (step, recorded[step], value)
    report = run.report()
    assert report["run"]["strategy"] == "MirroredStrategy" and report["run"]["replicas"] == 4
    assert report["summary"]["steps"] == 10
    # The learning rate each epoch ran with (Keras 3 does not log it; the agent adds it).
    printed_lr = [float(v) for (v,) in run.printed(r"Learning rate for epoch \d+ is (\S+)")]
    ends = [e for e in run.of(protocol.Epoch) if e.phase == "end"]
    assert [e.logs["learning_rate"] for e in ends] == pytest.approx(printed_lr, rel=1e-6)
    assert all("val_loss" in e.logs for e in ends)


def _steps_from_running_means(run: CorpusRun, steps_per_epoch: int) -> dict[int, float]:
    """Each step's own loss, from the running mean of its epoch that Keras logs after it."""
    running: dict[int, float] = {}
    for epoch, batch, value in run.printed(r"epoch (\d+) batch (\d+) running_loss (\S+)"):
        running[(int(epoch) - 1) * steps_per_epoch + int(batch)] = float(value)
    steps = {}
    for step, mean in running.items():
        k = (step - 1) % steps_per_epoch + 1
        steps[step] = k * mean - (k - 1) * running[step - 1] if k > 1 else mean
    return steps


@pytest.mark.parametrize("variant", ["keras3", "keras3_mixed", "tf_keras"])
def test_overridden_train_step_loss_is_what_keras_logs(tmp_path, variant):
    """The "Customizing fit" guide's train_step under MirroredStrategy: Keras 3's compute_loss (with
    and without mixed precision's scale_loss), tf_keras' compiled_loss (which divides the loss by the
    replicas for the gradient, but logs it whole). The loss shown is the one Keras logs."""
    args = ["--replicas", "4", "--epochs", "2", "--steps", "4"] + (["--mixed"] if variant == "keras3_mixed" else [])
    run = run_corpus(tmp_path, "custom_train_step.py", *args,
                     env={"TF_USE_LEGACY_KERAS": "1"} if variant == "tf_keras" else None)
    assert_common(run, steps=8, replicas=4)
    printed = _steps_from_running_means(run, 4)
    assert len(printed) == 8, run.describe()
    recorded = {s.step: s.loss for s in run.steps}
    for step, value in printed.items():
        assert recorded[step] == pytest.approx(value, rel=2e-5, abs=2e-5), (step, recorded[step], value)
    # No warning that Keras sums its logs over replicas: it does not here.
    assert not [e for e in run.of(protocol.Event) if e.source == "keras"], run.of(protocol.Event)


def test_several_phases_in_one_script(tmp_path):
    """fit, fit again, a custom loop, a tf.range loop: counts add up, each fit's total applies to it."""
    run = run_corpus(tmp_path, "fit_then_custom.py", "--replicas", "2")
    assert_common(run, steps=22, replicas=2)
    printed = {12 + int(step): float(loss) for step, loss in run.printed(r"custom step (\d+) loss (\S+)")}
    recorded = {s.step: s.loss for s in run.steps}
    for step, value in printed.items():
        assert recorded[step] == pytest.approx(value, rel=1e-5)
    for line in run.stderr.splitlines():
        m = re.match(r"step ([\d,]+)/([\d,]+)", line)
        if m:
            done, total = (int(g.replace(",", "")) for g in m.groups())
            assert done <= total, line


def test_one_device_strategy_counts_each_step_once(tmp_path):
    run = run_corpus(tmp_path, "one_device.py", "--steps", "10")
    printed = {int(step): float(loss) for step, loss in run.printed(r"step (\d+) loss (\S+)")}
    assert_common(run, steps=10, replicas=1, strategy="OneDeviceStrategy")
    assert_losses_equal(run, printed)


def test_eager_strategy_run_of_a_tf_function(tmp_path):
    """An eager ``strategy.run(tf_function)``: the function must stay a tf.function (TPUStrategy
    requires it; MirroredStrategy lifts it out of the caller's graph only then)."""
    run = run_corpus(tmp_path, "eager_run_function.py", "--replicas", "2", "--steps", "6")
    printed = {int(step): float(loss) for step, loss in run.printed(r"step (\d+) loss (\S+)")}
    assert_common(run, steps=6, replicas=2)
    assert_losses_equal(run, printed)


def test_multi_worker_tutorial_loss_across_workers(tmp_path):
    """Two MultiWorkerMirroredStrategy workers: the mean of every replica's loss at a step is the
    loss both workers print (SUM of the per-replica scaled losses)."""
    run = run_corpus(tmp_path, "multi_worker_tutorial.py", "--epochs", "2", "--steps-per-epoch", "3", workers=2,
                     timeout=300)
    assert run.returncode == 0, run.describe()
    printed = {int(step): float(loss) for step, loss in run.printed(r"worker 0 step (\d+) loss (\S+)")}
    assert len(printed) == 6
    per_step: dict[int, list[float]] = {}
    for worker in ("worker-0", "worker-1"):
        messages = read_messages(run.run_dir / worker / "events.jsonl")
        steps = [m for m in messages if isinstance(m, protocol.Step)]
        assert [s.step for s in steps] == list(range(1, 7)), steps
        topo = [m for m in messages if isinstance(m, protocol.Topology)][-1]
        assert topo.replicas == 2 and topo.num_workers == 2
        for s in steps:
            per_step.setdefault(s.step, []).extend(s.replica_losses)
    for step, value in printed.items():
        assert statistics.fmean(per_step[step]) == pytest.approx(value, rel=1e-5), (step, per_step[step], value)
    report = run.report()
    assert report["run"]["strategy"] == "MultiWorkerMirroredStrategy"


@pytest.mark.parametrize("env", [{"TF_USE_LEGACY_KERAS": "1"}, {}], ids=["legacy-flag", "plain"])
def test_the_keras_that_trains_is_reported_under_the_legacy_flag(tmp_path, env):
    """TF_USE_LEGACY_KERAS=1 with a script that imports Keras 3: the hello guessed tf_keras; the
    version reported is that of the Keras that ran fit. Without the flag too."""
    run = run_corpus(tmp_path, "keras3_import.py", env=env)
    (version,) = run.printed(r"trained with keras (\S+)")[0]
    assert_common(run, steps=4, replicas=1, strategy="_DefaultDistributionStrategy")
    assert run.report()["run"]["keras_version"] == version
    # `import keras` first imports TF from inside keras' own import: the loss hook once tried to
    # import keras there and failed on its half-made backend ("cannot import name 'cast'")
    assert [e.message for e in run.of(protocol.Event) if "loss hook not installed" in e.message] == []


def test_sampled_losses_carry_their_step(tmp_path):
    """Losses read at most every 50 ms of training: the records that carry one carry that step's
    own loss, and the rest carry none (never an old value)."""
    run = run_corpus(tmp_path, "custom_loop_tutorial.py", "--replicas", "2", "--epochs", "3", "--batches", "8",
                     env={"TPUWATCH_LOSS_EVERY_S": "0.05"})
    assert run.returncode == 0, run.describe()
    printed = {int(step): float(loss) for step, loss in run.printed(r"train step (\d+) loss (\S+)")}
    recorded = run.steps
    assert [s.step for s in recorded] == list(range(1, 25))
    with_loss = [s for s in recorded if s.replica_losses]
    assert recorded[0].replica_losses and 0 < len(with_loss) < len(recorded), [s.loss for s in recorded]
    for s in recorded:
        if s.replica_losses:
            assert s.loss == pytest.approx(printed[s.step], rel=1e-5)
        else:
            assert s.loss is None
    # Every step's batch was fetched eagerly: each record carries its fetch's wait and examples,
    # those without a read too (most of them take the steady path: tests/agent/test_steady_records.py
    # checks which).
    assert all(s.input_wait_s is not None and s.input_wait_s > 0 for s in recorded), [s.input_wait_s for s in recorded]
    assert {s.examples for s in recorded} == {recorded[0].examples} and recorded[0].examples, \
        [s.examples for s in recorded]


@pytest.mark.parametrize("shape,expected", [
    ("unrolled", [2, 4, 6, 8]),
    ("conditional", [1, 2]),
    ("nested", [1, 2, 5, 8]),
    ("no_strategy", [5, 10, 15, 20]),
    ("lazy_state", [1, 2, 3, 4]),
    ("perturbed", [1, 2, 3, 4]),
])
@pytest.mark.parametrize("eagerly", [False, True], ids=["graph", "run_functions_eagerly"])
def test_step_counts_follow_where_the_step_sits(tmp_path, shape, expected, eagerly):
    """Steps counted = the script's optimizer iterations, wherever the step sits: unrolled twice in
    one function, under a tensor ``if`` (calls that only evaluate count nothing), in a function
    also called from another function's ``tf.range`` loop, in a graph loop with no strategy and
    two tapes per batch, and in a step TF traces again inside its own variable-initialising ``cond``
    (a variable made on the first call, as the TPU guide's lazily built optimizer does on TF 2.16:
    its steps were counted twice), and after gradients with respect to its input (adversarial
    training: they are no steps, and the loss shown is the model's). The same with
    ``tf.config.run_functions_eagerly(True)``, where no graph counts them (the tensor ``if``
    counted every call; the loop with no strategy one step a call, with its first batch's loss;
    the input's gradients three steps a call)."""
    run = run_corpus(tmp_path, "step_shapes.py", "--shape", shape, *(["--run-functions-eagerly"] if eagerly else []))
    assert run.returncode == 0, run.describe()
    printed = [int(k) for _, k in run.printed(r"call (\d+) iterations (\d+)")]
    assert sorted(set(printed)) == expected, printed  # the script's own count
    recorded = run.steps
    assert [s.step for s in recorded] == expected, ([(s.step, s.steps) for s in recorded], run.describe())
    assert sum(s.steps for s in recorded) == expected[-1]
    # Where the script prints its last batch's loss, that is the loss of the call's last step.
    losses = {int(k): float(v) for _, k, v in run.printed(r"call (\d+) iterations (\d+) loss (\S+)")}
    assert losses or shape != "no_strategy"
    for step, value in losses.items():
        assert {s.step: s.loss for s in recorded}[step] == pytest.approx(value, rel=1e-5), (step, recorded)
    assert not [e for e in run.of(protocol.Event) if e.level in ("warning", "error") and e.source.startswith("probe")], \
        run.of(protocol.Event)


@pytest.mark.parametrize("shape", ["walkthrough", "accumulate", "fit"])
@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
def test_an_eager_loop_counts_its_updates(tmp_path, shape, legacy):
    """No tf.function at all (TF's custom training walkthrough; Keras' loop from scratch before it
    adds one; fit with run_eagerly=True): each optimizer update is a step, with the loss the script
    computed for it; several micro-batches' gradients before one update are one step; a gradient
    with respect to the input and no update (FGSM) is none. Before: no step at all."""
    run = run_corpus(tmp_path, "eager_loop.py", "--shape", shape, "--epochs", "2", "--batches", "5",
                     env={"TF_USE_LEGACY_KERAS": "1"} if legacy else None)
    (updates,) = [int(u) for (u,) in run.printed(r"^updates (\d+)")]
    assert updates == 10
    assert_common(run, steps=10, replicas=1, strategy="_DefaultDistributionStrategy")
    if shape == "fit":
        printed = _steps_from_running_means(run, 5)
        recorded = {s.step: s.loss for s in run.steps}
        assert sorted(printed) == sorted(recorded)
        for step, value in printed.items():
            assert recorded[step] == pytest.approx(value, rel=2e-5, abs=2e-5), (step, recorded[step], value)
    else:
        assert_losses_equal(run, {int(step): float(loss) for step, loss in run.printed(r"^step (\d+) loss (\S+)")})
    assert all(s.step_time_s > 0 for s in run.steps)


@pytest.mark.parametrize("shape,legacy,extra", [
    ("gan", False, []),
    ("gan", True, []),
    ("gan", False, ["--numpy"]),
    ("walkthrough", False, ["--numpy"]),
    ("adversarial", False, []),
    ("adversarial", True, []),
    ("adversarial", False, ["--compile"]),
    ("adversarial", False, ["--attack-sleep", "0.03"]),
    ("embedding", False, []),
    ("compiled_grads", False, []),
    ("minimize", True, ["--forward-sleep", "0.03"]),
    ("minimize", True, ["--forward-sleep", "0.03", "--loss-scale"]),
], ids=["gan-keras3", "gan-tf_keras", "gan-numpy", "walkthrough-numpy", "adversarial-keras3", "adversarial-tf_keras",
        "adversarial-tf.function", "adversarial-timed", "embedding", "compiled_grads",
        "minimize-legacy", "minimize-loss_scale"])
def test_eager_loops_of_other_shapes(tmp_path, shape, legacy, extra):
    """Loops as users write them beyond the walkthrough (each of these failed before its fix):
    - a GAN's two updates on one batch are one step with the discriminator's loss (as under
      tf.function; it counted two), from a dataset or NumPy slices;
    - one model's updates on NumPy slices after a peek at the dataset are a step each;
    - adversarial training shows the loss it trains on, not the first gradient's (taken with
      respect to the batch), eagerly or in a tf.function, and its steps' time holds the
      perturbation's;
    - a tf.function whose only gradient is with respect to tensors (a TPU embedding's
      activations) trains;
    - an eager gradient before training does not turn a later eager update of gradients a
      tf.function computed into an extra step;
    - ``minimize(loss, variables, tape=tape)``, which enters the script's tape again, keeps the
      forward pass in the step's time."""
    run = run_corpus(tmp_path, "eager_loop.py", "--shape", shape, "--epochs", "2", "--batches", "5", *extra,
                     env={"TF_USE_LEGACY_KERAS": "1"} if legacy else None)
    assert run.returncode == 0, run.describe()
    (updates,) = [int(u) for (u,) in run.printed(r"^updates (\d+)")]
    assert updates == 10
    assert_common(run, steps=10, replicas=1, strategy="_DefaultDistributionStrategy")
    assert_losses_equal(run, {int(step): float(loss) for step, loss in run.printed(r"^step (\d+) loss (\S+)")})
    if "--forward-sleep" in extra or "--attack-sleep" in extra:
        assert min(s.step_time_s for s in run.steps) >= 0.03, [s.step_time_s for s in run.steps]


@pytest.mark.parametrize("shape,per_step,extra", [
    ("accumulate", 3, []),
    ("compiled_forward", 1, []),
    ("walkthrough", 1, ["--jit-optimizer"]),
], ids=["accumulate", "compiled_forward", "tf_keras-xla-update"])
def test_an_eager_loops_input_wait_is_counted_once(tmp_path, shape, per_step, extra):
    """A slow pipeline (50 ms a batch) under an eager loop: the wait is every fetch of the step,
    counted once in its time (gradient accumulation fetches inside the step: its later fetches were
    counted twice, ~100 ms too much), and a tf.function called inside the step (a compiled forward
    pass; tf_keras' XLA update per variable, its default on a GPU) no longer wipes the wait and the
    examples (they were None)."""
    fetch = 0.05
    run = run_corpus(tmp_path, "eager_loop.py", "--shape", shape, "--epochs", "1", "--batches", "4",
                     "--fetch-sleep", str(fetch), *extra,
                     env={"TF_USE_LEGACY_KERAS": "1"} if "--jit-optimizer" in extra else None)
    assert run.returncode == 0, run.describe()
    assert [s.step for s in run.steps] == [1, 2, 3, 4]
    for s in run.steps:
        assert s.examples == 32 * per_step, s
        assert s.input_wait_s is not None and s.input_wait_s >= 0.9 * fetch * per_step, s
        assert s.step_time_s >= s.input_wait_s, s
    took = {int(step): float(t) for step, t in run.printed(r"^step (\d+) took (\S+)")}
    for s in run.steps[1:]:  # the first step's interval also holds the iterator's creation
        # At most the script's own time from one update to the next (a fetch counted twice was
        # ~100 ms more than that).
        assert s.step_time_s <= took[s.step] + 0.01, (s, took[s.step])

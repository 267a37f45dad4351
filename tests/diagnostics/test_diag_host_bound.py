"""``host-bound`` over a run's messages: the ledger's host time between steps and the agent's
samples of the training thread (no TensorFlow)."""

from __future__ import annotations

from tpuwatch import protocol
from tpuwatch.monitor.diagnostics.host_bound import CALLBACK_FIX, LOGGING_FIX, PIPELINE_FIX
from tpuwatch.monitor.monitor import Monitor
from tpuwatch.protocol import Exit, Hello, HostSites, Step

T0 = 1_750_000_000.0


def _run(gap_s: float, sites: HostSites, steps: int = 100, step_s: float = 0.05) -> list[protocol.Finding]:
    monitor = Monitor(lambda: monitor.state.last_message_t or 0.0)
    msgs: list[protocol.Message] = [Hello(
        protocol_version=protocol.PROTOCOL_VERSION, agent_version="0.1.0", run_id="r", t=T0, pid=1, host="h",
        worker="h:1", python_version="3.11", tf_version="2.21.0", keras_version="3.15.0", script="train.py",
        argv=("train.py",))]
    t = T0 + 2.0  # starting: not training time
    for i in range(1, steps + 1):
        t += gap_s + step_s
        msgs.append(Step(step=i, t=t, step_time_s=step_s, input_wait_s=0.0, loss=1.0))
    msgs += [sites, Exit(t=t + 0.5, exit_code=0)]
    for m in msgs:
        monitor.take(m)
    monitor.evaluate(t + 0.5, force=True)
    return [f for f in monitor.feed.engine.findings() if f.rule == "host-bound"]


def _sites(samples: int, rows: list[tuple[str, int, str, str, str, str, str]], script: int | None = None) -> HostSites:
    return HostSites(
        t=T0 + 30, samples=samples, script_samples=sum(r[1] for r in rows) if script is None else script,
        step_samples=10, sample_interval_s=0.25, sites=tuple(r[0] for r in rows), counts=tuple(r[1] for r in rows),
        kinds=tuple(r[2] for r in rows), roles=tuple(r[3] for r in rows), functions=tuple(r[4] for r in rows),
        callers=tuple(r[5] for r in rows), code=tuple(r[6] for r in rows))


GENERATOR = [
    ("train.py:30", 40, "numpy", "generator", "batches", "train.py:61", "image = rng.random((96, 96, 3))"),
    ("train.py:33", 12, "python", "generator", "batches", "train.py:61", "yield image, label"),
    ("train.py:62", 8, "logging", "loop", "<module>", "", "print(step, loss.numpy())"),
]


def test_batches_built_in_a_generator_name_its_lines_and_advise_tf_data():
    (f,) = _run(gap_s=0.15, sites=_sites(60, GENERATOR))
    ev = f.evidence
    assert f.severity == "warning"
    assert ev["host_between_steps_pct"] == 75  # 0.15 s of every 0.2 s, from the first step on
    assert ev["host_between_steps_s"] == 14.85 and ev["training_s"] == 19.85  # 99 gaps; 100 steps
    assert (ev["culprit_site"], ev["culprit_role"], ev["culprit_function"], ev["culprit_caller"]) == \
        ("train.py:30", "generator", "batches", "train.py:61")
    assert ev["culprit_kind"] == "numpy" and ev["culprit_share_pct"] == 87  # 52 of 60 samples
    assert "in the generator batches(), consumed at train.py:61" in f.message and "75%" in f.message
    assert f.advice.startswith("train.py:30: `image = rng.random((96, 96, 3))`") and PIPELINE_FIX in f.advice
    assert "train.py:30 (67%); train.py:33 (20%)" == ev["lines"]


def test_a_callback_reading_weights_every_batch_is_told_to_do_it_every_n_batches():
    rows = [("train.py:20", 30, "tensor read", "callback", "Keep.on_train_batch_end", "Keep.on_train_batch_end",
             "self.kept.append(self.model.get_weights())")]
    (f,) = _run(gap_s=0.03, sites=_sites(40, rows))  # 37% of the training time
    assert f.evidence["host_between_steps_pct"] == 37
    assert f.evidence["culprit_role"] == "callback" and CALLBACK_FIX in f.advice
    assert "in the callback Keep.on_train_batch_end, reading tensors back to the host" in f.message


def test_logging_every_step_is_told_steps_per_execution_or_less_often():
    rows = [("train.py:62", 30, "logging", "loop", "<module>", "", "print(step, loss.numpy())")]
    (f,) = _run(gap_s=0.1, sites=_sites(40, rows))
    assert LOGGING_FIX in f.advice and "steps_per_execution" in f.advice


def test_quiet_below_the_share_without_script_lines_or_without_samples():
    assert _run(gap_s=0.01, sites=_sites(60, GENERATOR)) == []  # 17% of the time between steps
    # Keras' own code between steps (no frame of the script's on most samples): nothing to name
    assert _run(gap_s=0.15, sites=_sites(60, GENERATOR[:1], script=20)) == []
    assert _run(gap_s=0.15, sites=_sites(3, GENERATOR[:1], script=3)) == []  # 0.75 s of samples


def test_under_a_second_between_steps_is_named_when_the_samples_say_where():
    # A 300-step fit whose callback read the weights every batch spent 0.98-1.75 s between steps
    # (30-42 % of its training) from run to run; below 1 s it got no finding. At 20 samples a
    # second, half a second of host time is ten samples: enough to name a line.
    callback = [("train.py:27", 12, "tensor read", "callback", "WeightDrift.on_train_batch_end", "",
                 "weights = self.model.get_weights()")]
    (f,) = _run(gap_s=0.007, step_s=0.01, sites=_sites(14, callback))  # 0.69 s between steps, 41 %
    assert f.evidence["culprit_function"] == "WeightDrift.on_train_batch_end"
    assert _run(gap_s=0.003, step_s=0.004, sites=_sites(6, callback)) == []  # 0.3 s: too little to name

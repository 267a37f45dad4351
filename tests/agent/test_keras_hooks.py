"""Keras hooks on a real model.fit, and the post-import mechanism they rely on."""

from __future__ import annotations

import sys

import pytest

from tpuwatch import protocol
from tpuwatch.agent import keras_hooks, post_import
from tpuwatch.agent.patches import Patches
from tpuwatch.agent.runtime import Agent


@pytest.fixture
def run(tmp_path):
    agent = Agent(run_dir=tmp_path, run_id="t")
    patches = Patches()
    state = {}

    def finish() -> list[protocol.Message]:
        agent.stop()
        patches.restore()
        state["done"] = True
        return [protocol.decode(line) for line in (tmp_path / "events.jsonl").read_bytes().splitlines()]

    yield agent, patches, finish
    post_import.cancel_all()
    patches.restore()
    if "done" not in state:
        agent.stop()


@pytest.mark.tf
def test_fit_reports_epochs_and_config(run):
    agent, patches, finish = run
    import keras
    import numpy as np

    hooks = keras_hooks.install(agent, patches)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", metrics=["mae"], steps_per_execution=1)
    x = np.zeros((12, 4), "float32")
    y = np.ones((12, 1), "float32")
    history = model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2  # the user's fit is unchanged
    messages = finish()

    configs = [m for m in messages if isinstance(m, protocol.Config) and m.epochs is not None]
    assert len(configs) == 1
    assert (configs[0].epochs, configs[0].total_steps, configs[0].steps_per_execution) == (2, 6, 1)
    policies = [m.mixed_precision for m in messages if isinstance(m, protocol.Config) and m.mixed_precision]
    assert policies == ["float32"]

    epochs = [m for m in messages if isinstance(m, protocol.Epoch)]
    assert [(e.epoch, e.phase) for e in epochs] == [(0, "begin"), (0, "end"), (1, "begin"), (1, "end")]
    end = epochs[-1]
    assert set(end.logs) >= {"loss", "mae"}
    assert all(type(v) is float for v in end.logs.values())
    assert end.logs["loss"] == pytest.approx(history.history["loss"][-1])
    assert hooks.epoch == 1
    assert [m for m in messages if isinstance(m, protocol.Event)] == []


@pytest.mark.tf
def test_user_callback_errors_pass_through(run):
    agent, patches, finish = run
    import keras
    import numpy as np

    keras_hooks.install(agent, patches)

    class Boom(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise KeyError("user callback")

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with pytest.raises(KeyError, match="user callback"):
        model.fit(np.zeros((4, 2)), np.zeros((4, 1)), epochs=1, verbose=0, callbacks=[Boom()])
    messages = finish()
    assert [m for m in messages if isinstance(m, protocol.Event)] == []


def test_plain_logs():
    np = pytest.importorskip("numpy")
    logs = {"loss": np.float32(0.5), "acc": 1, "flag": True, "name": "x", "vec": np.zeros(3), "lr": np.array(0.1)}
    assert keras_hooks.plain_logs(logs) == {"loss": 0.5, "acc": 1.0, "lr": pytest.approx(0.1)}
    assert keras_hooks.plain_logs(None) == {}


@pytest.mark.parametrize(("logged", "says"), [(8.0, True), (2.0, False), (2.00001, False)])
def test_a_logged_loss_summed_over_replicas_is_explained_once(tmp_path, logged, says):
    """Keras 3.0-3.2 (TF 2.16's first Keras) sum their logs over replicas, TPUs included: with 4 replicas
    whose mean is 2.0 its progress bar says 8.0. Seen on Keras 3.0.5 + TF 2.16.2 with the agent's
    own fit test script; later Keras versions log the mean, so this is the decision alone, on the
    values a run's first batch gives it."""
    from tpuwatch.agent.steps import StepProbe

    agent = Agent(tmp_path, "t")
    agent.step_probe = StepProbe(agent)
    agent.global_step = 5
    agent.step_probe.last_loss = (5, 2.0, 4)
    hooks = keras_hooks.KerasHooks(agent)
    hooks.check_logged_loss({"loss": logged})
    hooks.check_logged_loss({"loss": logged})  # checked once
    assert hooks.logs_checked
    notes = [m for m in agent._buf if isinstance(m, protocol.Event) and m.source == "keras"]
    assert len(notes) == (1 if says else 0), notes
    if says:
        assert "summed over the 4 replicas" in notes[0].message and "8 at step 5" in notes[0].message


@pytest.mark.parametrize(("version", "sums"), [
    ("3.0.5", True), ("3.1.1", True), ("3.2.1", True), ("3.3.3", False), ("3.6.0", False), ("3.15.1", False),
    ("tf_keras 2.21.0", False), (None, False),
])
def test_only_the_keras_versions_that_sum_their_logs_are_checked(version, sums):
    """Keras 3.0-3.2 turn "auto" into "sum" in reduce_per_replica (read in their sources); 3.3 and
    later average. A tf_keras train_step's compiled loss is 1/N of its logged loss, which once made
    the check say, wrongly, that Keras sums."""
    assert keras_hooks.sums_logs_over_replicas(version) is sums


def test_patches_a_module_when_it_is_imported_later(tmp_path, monkeypatch):
    (tmp_path / "late_mod_tw.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen, errors = [], []
    post_import.when_imported("late_mod_tw", lambda m: seen.append(m.VALUE + 1), errors.append)
    assert seen == []
    import late_mod_tw  # noqa: F401

    assert seen == [42] and errors == []
    # Already imported: the callback runs at once; a failing callback reports, the import is fine.
    post_import.when_imported("late_mod_tw", lambda m: 1 / 0, errors.append)
    assert len(errors) == 1 and isinstance(errors[0], ZeroDivisionError)
    post_import.cancel_all()
    sys.modules.pop("late_mod_tw", None)

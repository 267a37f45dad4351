"""Retrace probe against real tf.function tracing (in-process, CPU)."""

from __future__ import annotations

import pytest

from tpuwatch import protocol
from tpuwatch.agent import retraces
from tpuwatch.agent.patches import Patches
from tpuwatch.agent.runtime import Agent


@pytest.fixture
def probe(tmp_path):
    agent = Agent(run_dir=tmp_path, run_id="t")
    patches = Patches()
    retraces.install(agent, patches)
    messages: list[protocol.Message] = []

    def read() -> list[protocol.Message]:
        agent.stop()
        patches.restore()
        lines = (tmp_path / "events.jsonl").read_bytes().splitlines()
        messages.extend(protocol.decode(line) for line in lines)
        return messages

    yield read
    patches.restore()
    if not messages:
        agent.stop()


def _retraces(messages, name):
    return [m for m in messages if isinstance(m, protocol.Retrace) and m.function == name]


def _no_probe_failures(messages):
    failures = [m for m in messages if isinstance(m, protocol.Event) and m.level == "warning"]
    assert failures == []


@pytest.mark.tf
def test_ragged_batches_retrace_once_per_shape_and_name_the_shape(probe, tf):
    # 96, 96, 64 then 40, 40, 16: two datasets whose last batch is short (no drop_remainder).
    images = tf.zeros((256, 28, 28, 1))
    more = tf.zeros((96, 28, 28, 1))

    @tf.function
    def train_step(x):
        return tf.reduce_sum(x * 2.0)

    shapes = set()
    for ds in (tf.data.Dataset.from_tensor_slices(images).batch(96),
               tf.data.Dataset.from_tensor_slices(more).map(lambda x: x + 1.0).batch(40)):
        for batch in ds:
            shapes.add(tuple(batch.shape))
            train_step(batch)
    messages = probe()
    _no_probe_failures(messages)
    seen = _retraces(messages, "train_step")
    assert len(shapes) == 4
    assert len(seen) >= len(shapes)
    assert [m.traces for m in seen] == list(range(1, len(seen) + 1))
    assert seen[0].change == ""
    assert seen[0].signature == "x: float32(96, 28, 28, 1)"
    assert seen[1].change == "x: shape (96, 28, 28, 1) -> (64, 28, 28, 1)"
    assert all(m.instances == 1 for m in seen)
    # tf.data's own functions (the map body, iterator helpers) are not user retraces.
    assert {m.function for m in messages if isinstance(m, protocol.Retrace)} == {"train_step"}


@pytest.mark.tf
def test_static_shapes_trace_exactly_once(probe, tf):
    ds = tf.data.Dataset.from_tensor_slices(tf.zeros((64, 4))).batch(16, drop_remainder=True)

    @tf.function
    def train_step(x):
        return tf.reduce_mean(x)

    for _ in range(2):
        for batch in ds:
            train_step(batch)
    messages = probe()
    seen = _retraces(messages, "train_step")
    assert len(seen) == 1
    assert seen[0].traces == 1


@pytest.mark.tf
def test_python_float_argument_change_is_the_cause(probe, tf):
    @tf.function
    def apply(x, lr):
        return x * lr

    x = tf.ones((3,))
    apply(x, 0.1)
    apply(x, 0.1)
    apply(x, 0.05)
    messages = probe()
    seen = _retraces(messages, "apply")
    assert [m.traces for m in seen] == [1, 2]
    assert seen[0].signature == "x: float32(3,), lr: 0.1"
    assert seen[1].change == "lr: python float 0.1 -> 0.05"


@pytest.mark.tf
def test_dtype_change_and_new_argument(probe, tf):
    @tf.function
    def f(y, z=None):
        return y if z is None else y + z

    f(tf.ones((2,), tf.float32))
    f(tf.ones((2,), tf.float64))
    f(tf.ones((2,), tf.float64), tf.ones((2,), tf.float64))
    messages = probe()
    seen = _retraces(messages, "f")
    assert seen[1].change == "y: dtype float32 -> float64"
    assert seen[2].change == "z: python None -> tensor float64(2,)"


@pytest.mark.tf
def test_function_recreated_in_a_loop_counts_instances(probe, tf):
    for i in range(4):
        @tf.function
        def scale(x):
            return x * 3.0

        scale(tf.constant(float(i)))
    messages = probe()
    seen = _retraces(messages, "scale")
    assert [m.instances for m in seen] == [1, 2, 3, 4]
    assert [m.traces for m in seen] == [1, 2, 3, 4]
    assert seen[1].change == "new tf.function object, same inputs"


@pytest.mark.tf
def test_first_call_creating_variables_counts_as_tf_counts_it(probe, tf):
    """TF traces twice when the first call creates variables (the tryout's lazily built Adam
    slots: the script printed 17 traces, tpuwatch said 16). Both are counted, the second with its
    cause; a function whose variables exist beforehand traces once."""
    holder = {}

    @tf.function
    def counter(x):
        if "v" not in holder:
            holder["v"] = tf.Variable(0.0)
        return holder["v"].assign_add(x)

    ready = tf.Variable(0.0)

    @tf.function
    def prebuilt(x):
        return ready.assign_add(x)

    for value in (1.0, 2.0):
        counter(tf.constant(value))
        prebuilt(tf.constant(value))
    messages = probe()
    seen = _retraces(messages, "counter")
    assert [m.traces for m in seen] == [1, counter.experimental_get_tracing_count()] == [1, 2]
    assert seen[1].change == protocol.VARIABLES_MADE_CHANGE
    assert [m.traces for m in _retraces(messages, "prebuilt")] == [prebuilt.experimental_get_tracing_count()] == [1]


@pytest.mark.tf
def test_nested_keras_functions_are_reported(probe, tf):
    keras = pytest.importorskip("keras")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x = tf.zeros((12, 4))
    model.fit(x, tf.zeros((12, 1)), batch_size=4, epochs=1, verbose=0)
    messages = probe()
    names = {m.function for m in messages if isinstance(m, protocol.Retrace)}
    # Keras < 3.4 calls fit's outer function one_step_on_iterator when steps_per_execution is 1.
    assert "one_step_on_data" in names and names & {"multi_step_on_iterator", "one_step_on_iterator"}, names


@pytest.mark.tf
def test_user_exceptions_pass_through_and_patches_restore(probe, tf):
    from tensorflow.python.eager.polymorphic_function import tracing_compilation

    original = tracing_compilation._create_concrete_function.__tpuwatch_original__

    @tf.function(autograph=False)  # autograph would wrap the error in its StagingError
    def broken(x):
        raise ZeroDivisionError("user bug")

    with pytest.raises(ZeroDivisionError, match="user bug"):
        broken(tf.constant(1.0))
    messages = probe()
    _no_probe_failures(messages)
    assert tracing_compilation._create_concrete_function is original


@pytest.mark.tf
def test_probe_failure_disables_it_and_tracing_goes_on(probe, monkeypatch, tf):
    def boom(self, function_type, tracing_options, marks_before):
        raise RuntimeError("probe bug")

    monkeypatch.setattr(retraces.RetraceProbe, "on_trace", boom)

    @tf.function
    def g(x):
        return x + 1

    assert float(g(tf.constant(1.0))) == 2.0
    assert float(g(tf.constant([1.0, 2.0]))[1]) == 3.0
    messages = probe()
    events = [m for m in messages if isinstance(m, protocol.Event)]
    assert len(events) == 1 and "probe retraces disabled: RuntimeError: probe bug" in events[0].message


def test_change_text_unit():
    a = [retraces.Leaf("x", "tensor", "float32(96, 2)", "float32", (96, 2), key="float32(96, 2)")]
    b = [retraces.Leaf("x", "tensor", "float32(None, 2)", "float32", (None, 2), key="float32(None, 2)")]
    assert retraces.change_text(a, b) == "x: shape (96, 2) -> (None, 2)"
    assert retraces.change_text(a, []) == "argument x removed"
    assert retraces.change_text(a, a) == ""

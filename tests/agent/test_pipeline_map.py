"""The pipeline map: every dataset the training iterates, sent once, each stage with
the script's line that made it and its settings. Real TensorFlow."""

from __future__ import annotations

import re

import pytest

from tpuwatch import protocol
from tpuwatch_testing import SCRIPTS

pytestmark = pytest.mark.tf
SCRIPT = SCRIPTS / "pipelines.py"


def _marked() -> dict[str, int]:
    out = {}
    for n, line in enumerate(SCRIPT.read_text().splitlines(), start=1):
        m = re.search(r"# stage (\w+)$", line)
        if m:
            out[m.group(1)] = n
    return out


USER = ["from_tensor_slices", "map", "cache", "shuffle", "batch", "prefetch"]


@pytest.mark.parametrize("mode, consumer, extra", [
    ("custom", "experimental_distribute_dataset", []),
    ("fit", "experimental_distribute_dataset", []),
    ("from_function", "distribute_datasets_from_function", []),
    ("iterator_fn", "experimental_distribute_dataset", ["repeat"]),
    ("in_function", "experimental_distribute_dataset", []),  # mapped outside the user's graph
    ("plain", "iterator", []),
    ("eager_next", "experimental_distribute_dataset", []),
    ("progress", "iterator", []),
    ("peek", "iterator", []),  # a one-off next(iter(ds)) is no loop's fetch
])
def test_each_stage_is_named_with_its_line_and_settings(run_agent, mode, consumer, extra):
    run = run_agent(SCRIPT, "--mode", mode)
    assert run.returncode == 0, run.output
    pipes = [m for m in run.messages if isinstance(m, protocol.Pipeline)]
    # once per dataset, whatever the iterators made underneath; said again, with the line that
    # fetches its batches, once the script fetches one eagerly
    assert {m.dataset for m in pipes} == {1} and len(pipes) <= 2, pipes
    assert all(m.consumer_site == "" for m in pipes[:1]), pipes
    p = pipes[-1]
    assert p.consumer == consumer
    lines = _marked()
    user = [(stage, site) for stage, site, by in zip(p.stages, p.sites, p.added_by) if not by]
    assert [s for s, _ in user][:len(USER) + len(extra)] == USER + extra, p
    for stage, site in user[:len(USER) + len(extra)]:
        assert site == f"pipelines.py:{lines[stage]}", (stage, site, p)
    settings = dict(zip(p.stages, p.settings))
    assert settings["map"] == ""  # sequential
    assert settings["prefetch"] == "buffer_size=2"
    assert settings["shuffle"] == "buffer_size=64"
    assert "drop_remainder=True" in settings["batch"]
    holds = dict(zip(p.stages, p.holds_bytes))
    assert holds["cache"] == 256 * (8 * 4 + 8)  # 256 elements of float32[8] and int64
    assert holds["shuffle"] == 64 * (8 * 4 + 8)
    assert p.code[p.stages.index("map")] == "ds = ds.map(scale)  # stage map"
    if mode in ("custom", "fit", "plain"):  # the script's batches per pass, not the replicas' after rebatch
        assert p.elements == 256 // 32, p
    # the script's line that fetches each batch eagerly (a for loop, next() in Python, a for loop
    # over a progress bar's iteration); iter() handed to a tf.function, Keras' fit and a loop
    # inside a tf.function fetch in the step
    loop = [n for n, line in enumerate(SCRIPT.read_text().splitlines(), start=1) if line.endswith(f"# loop {mode}")]
    assert p.consumer_site == (f"pipelines.py:{loop[0]}" if loop else ""), p
    assert p.tf_prefetch is True  # TensorFlow's inject_prefetch is on (default options)
    # scale() is stateless: map_parallelization runs the script's map in parallel, no other of its stages
    assert [st for st, par, by in zip(p.stages, p.tf_parallel, p.added_by) if par and not by] == ["map"], p
    assert not run.warnings, run.warnings


@pytest.mark.parametrize("mode", ["plain", "custom"])
def test_options_that_turn_autotune_off_say_tensorflow_adds_no_prefetch(run_agent, mode):
    run = run_agent(SCRIPT, "--mode", mode, "--autotune-off")
    assert run.returncode == 0, run.output
    p = [m for m in run.messages if isinstance(m, protocol.Pipeline)][-1]
    assert p.tf_prefetch is False and not any(p.tf_parallel), p


def test_numpy_into_fit_is_a_pipeline_keras_made(run_agent):
    run = run_agent(SCRIPT, "--mode", "fit_numpy")
    assert run.returncode == 0, run.output
    (p,) = [m for m in run.messages if isinstance(m, protocol.Pipeline)]
    fit_line = f"pipelines.py:{_marked()['fit']}"
    # Keras' stages, then what tf.distribute adds to the dataset it iterates: none the script's
    assert p.added_by[0] == "keras" and all(p.added_by), p
    assert set(p.sites) == {fit_line}, p


def _runs_as(source, fn, name: str) -> bool:
    """``source.map(fn)`` runs as ``name`` after TensorFlow's graph rewrites."""
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing

    try:
        list(source.apply(testing.assert_next([name])).map(fn).take(1).as_numpy_iterator())  # not: the error
        return True
    except tf.errors.InvalidArgumentError:
        return False


def test_the_maps_tensorflow_parallelizes_are_the_ones_marked():
    # the claim the doctor rests on (no "add num_parallel_calls" for them), checked against TF
    import tensorflow as tf

    from tpuwatch.agent import pipeline_map

    def stateless(x):
        return x * 2

    def stateful(x):
        return tf.numpy_function(lambda v: v, [x], tf.int64)

    def asserted(x):  # an If around the Assert: TF looks into it, so does the agent
        tf.debugging.assert_non_negative(x)
        return x + 1

    def branches(x):
        return tf.cond(x > 1, lambda: x, lambda: -x)

    def seeded_random(x):
        return x + tf.random.uniform((), maxval=3, dtype=tf.int64, seed=1)

    def stateless_random(x):
        return x + tf.random.stateless_uniform((), seed=[1, 2], maxval=3, dtype=tf.int64)

    def printed(x):
        tf.print(x)
        return x

    no_autotune = tf.data.Options()
    no_autotune.autotune.enabled = False
    for fn, options, parallel in [(stateless, None, True), (stateful, None, False), (stateless, no_autotune, False),
                                  (asserted, None, True), (branches, None, True), (seeded_random, None, False),
                                  (stateless_random, None, True), (printed, None, False),
                                  (tf.function(stateless), None, True)]:
        source = tf.data.Dataset.range(4)
        if options is not None:
            source = source.with_options(options)
        mapped = source.map(fn)
        assert _runs_as(source, fn, "ParallelMap" if parallel else "Map"), (fn, options)
        assert (pipeline_map._rewrites(mapped)[1] and pipeline_map._stateless(mapped)) is parallel, (fn, options)


def test_the_pipelines_tensorflow_prefetches_are_the_ones_marked():
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing

    from tpuwatch.agent import pipeline_map

    def stateful(x):
        return tf.numpy_function(lambda v: v, [x], tf.int64)

    def prefetched(source) -> bool:  # a Prefetch follows the script's last stage after the rewrites
        try:
            list(source.apply(testing.assert_next(["Map", "Prefetch"])).map(stateful).as_numpy_iterator())
            return True
        except tf.errors.InvalidArgumentError:
            return False

    for attr, value in [(None, None), ("autotune.enabled", False),
                        ("experimental_optimization.inject_prefetch", False),
                        ("experimental_optimization.apply_default_optimizations", False)]:
        source = tf.data.Dataset.range(4)
        if attr is not None:
            options = tf.data.Options()
            group, name = attr.split(".")
            setattr(getattr(options, group), name, value)
            source = source.with_options(options)
        assert prefetched(source) is (attr is None), attr
        assert pipeline_map._rewrites(source.map(stateful))[0] is (attr is None), attr


#: A Keras script in the shape of a TFRecord recipe: one function makes the train, validation and
#: test datasets; predict is called on a few single examples afterwards.
KERAS_USES = """\
import numpy as np
import tensorflow as tf
import keras

rng = np.random.default_rng(0)


def make_dataset(n):
    ds = tf.data.Dataset.from_tensor_slices((rng.random((n, 8), dtype=np.float32), rng.integers(0, 2, n)))
    ds = ds.map(lambda x, y: (x * 2.0, y), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(16).prefetch(tf.data.AUTOTUNE)


model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(make_dataset(128), validation_data=make_dataset(32), epochs=2, verbose=0)
model.evaluate(make_dataset(32), verbose=0)
for _ in range(3):
    model.predict(rng.random((1, 8), dtype=np.float32), verbose=0)
"""


def test_each_pipeline_says_what_keras_iterates_it_for(run_agent, tmp_path):
    """fit's data, its validation data, evaluate's and predict's: the report told three identical
    blocks apart by nothing, and listed each predict call's pipeline on its own."""
    from tpuwatch.console import report

    script = tmp_path / "recipe.py"
    script.write_text(KERAS_USES)
    run = run_agent(script)
    assert run.returncode == 0, run.output
    latest = {m.dataset: m for m in run.messages if isinstance(m, protocol.Pipeline)}
    assert [latest[n].use for n in sorted(latest)] == ["train", "validation", "test", "predict", "predict",
                                                        "predict"], latest
    text = report.render_text(report.build_model(run.run_dir))
    section = text.split("\nInput pipeline\n")[1].split("\n\n")[0]
    heads = [line.strip() for line in section.splitlines() if line.startswith("  dataset")]
    assert heads == ["datasets 1, 2, 3 (train, validation, test; iterator), 8, 2, 2 batches per pass",
                     "datasets 4, 5, 6 (predict x3; iterator)"], section

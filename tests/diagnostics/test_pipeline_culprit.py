"""The stage that starves the step, from the pipeline map: one edit naming its line, never what
the pipeline already has."""

from __future__ import annotations

import pytest
from diag_synthetic import SyntheticRun, findings

from tpuwatch.monitor.diagnostics.pipeline_doctor import culprit
from tpuwatch.protocol import Pipeline


def pipe(*stages: tuple[str, str, str], added_by: str = "", consumer: str = "iterator") -> Pipeline:
    """stages: (name, settings, code); stage i is at train.py:(40 + i)."""
    n = len(stages)
    return Pipeline(t=0.0, dataset=1, consumer=consumer, stages=tuple(s[0] for s in stages),
                    sites=tuple(f"train.py:{40 + i}" for i in range(n)),
                    settings=tuple(s[1] for s in stages), code=tuple(s[2] for s in stages),
                    holds_bytes=(0,) * n, added_by=(added_by,) * n)


SOURCE = ("from_tensor_slices", "", "ds = tf.data.Dataset.from_tensor_slices((x, y))")
BATCH = ("batch", "batch_size=64, drop_remainder=False", "ds = ds.batch(64)")
PREFETCH = ("prefetch", "buffer_size=AUTOTUNE", "ds = ds.prefetch(tf.data.AUTOTUNE)")


def test_a_sequential_map_is_named_with_its_line_and_edit():
    c = culprit(pipe(SOURCE, ("map", "", "ds = ds.map(decode)"), BATCH, PREFETCH), fetch_in_step=True)
    assert (c.stage, c.site) == ("map", "train.py:41")
    assert c.new_code == "ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE)"
    assert "prefetch" not in c.fix  # it has one


def test_a_map_before_the_cache_runs_once_and_is_not_blamed():
    c = culprit(pipe(SOURCE, ("map", "", "ds = ds.map(decode)"), ("cache", "filename=''", "ds = ds.cache()"),
                     BATCH, PREFETCH), fetch_in_step=True)
    assert c.stage == ""


def test_no_prefetch_at_the_end_is_added_after_the_last_stage():
    c = culprit(pipe(SOURCE, ("shuffle", "buffer_size=1024", "ds = ds.shuffle(1024)"), BATCH), fetch_in_step=True)
    assert (c.stage, c.site) == ("prefetch", "train.py:42")
    assert c.new_code == "ds = ds.batch(64).prefetch(tf.data.AUTOTUNE)"


PARALLEL_MAP = ("map", "num_parallel_calls=AUTOTUNE, deterministic='default'",
                "ds = ds.map(f, num_parallel_calls=tf.data.AUTOTUNE)")


@pytest.mark.parametrize("stages", [
    (SOURCE, PARALLEL_MAP, BATCH),  # tf.data fuses them into one parallel map-and-batch
    (SOURCE, PARALLEL_MAP, BATCH, ("repeat", "count=-1", "ds = ds.repeat()")),
    (SOURCE, BATCH, PARALLEL_MAP),
    (SOURCE, ("interleave", "cycle_length=4, block_length=1, num_parallel_calls=AUTOTUNE",
              "ds = files.interleave(read, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)"), BATCH),
    (SOURCE, ("batch", "batch_size=64, num_parallel_calls=AUTOTUNE", "ds = ds.batch(64, num_parallel_calls=-1)"),),
], ids=["map-batch", "map-batch-repeat", "batch-map", "interleave-batch", "parallel-batch"])
def test_no_final_prefetch_is_advised_after_a_parallel_last_stage(stages):
    # the parallel stage runs ahead by itself (and TF's inject_prefetch adds a prefetch after
    # it): bench/prefetch_after_parallel_map.py measured no wait cut by adding one
    c = culprit(pipe(*stages), fetch_in_step=True)
    assert c.stage != "prefetch" and "prefetch(" not in c.fix and not c.new_code, c


def test_a_prefetch_before_with_options_or_repeat_counts():
    c = culprit(pipe(SOURCE, BATCH, PREFETCH, ("repeat", "count=-1", "ds = ds.repeat()"),
                     ("with_options", "", "ds = ds.with_options(options)")), fetch_in_step=True)
    assert c.stage != "prefetch", c


@pytest.mark.parametrize("settings, code, new", [
    ("cycle_length=1, block_length=1", "ds = files.interleave(tf.data.TFRecordDataset, cycle_length=1)",
     "ds = files.interleave(tf.data.TFRecordDataset, cycle_length=tf.data.AUTOTUNE, "
     "num_parallel_calls=tf.data.AUTOTUNE)"),
    ("cycle_length=4, block_length=1", "ds = files.interleave(read, cycle_length=4)",
     "ds = files.interleave(read, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)"),
])
def test_an_interleave_reading_one_input_at_a_time(settings, code, new):
    c = culprit(pipe(SOURCE, ("interleave", settings, code), BATCH, PREFETCH), fetch_in_step=True)
    assert c.stage == "interleave" and c.new_code == new


def test_files_read_one_at_a_time():
    c = culprit(pipe(("tensorslice", "", "ds = tf.data.TFRecordDataset(files)"),
                     ("tfrecord", "num_parallel_reads=None", "ds = tf.data.TFRecordDataset(files)"),
                     BATCH, PREFETCH), fetch_in_step=True)
    assert c.stage == "tfrecord"
    assert c.new_code == "ds = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)"


def test_numpy_into_fit_says_there_is_no_pipeline():
    c = culprit(pipe(("range", "", ""), ("map", "", ""), added_by="keras"), fetch_in_step=True)
    assert c.stage == "" and "NumPy" in c.problem and "train.py:40" in c.fix


def test_numpy_into_fit_is_not_told_to_prefetch_what_keras_prefetches():
    c = culprit(pipe(("range", "", ""), ("parallelmap", "num_parallel_calls=AUTOTUNE", ""),
                     ("prefetch", "buffer_size=AUTOTUNE", ""), added_by="keras"), fetch_in_step=True)
    assert c.stage == "" and "NumPy" in c.problem and "train.py:40" in c.problem
    assert "prefetch" not in c.fix and "tf.data.Dataset" not in c.fix and not c.new_code


def test_a_healthy_pipeline_in_a_custom_loop_blames_the_eager_fetch():
    c = culprit(pipe(SOURCE, BATCH, PREFETCH, consumer="experimental_distribute_dataset"), fetch_in_step=False)
    assert "eager fetch" in c.problem and "next(iterator)" in c.fix
    assert "prefetch" not in c.fix and "num_parallel_calls" not in c.fix


def test_the_input_bound_finding_carries_the_culprit():
    run = SyntheticRun(step_time_s=0.05)
    run.emit(pipe(SOURCE, ("map", "", "ds = ds.map(decode)"), BATCH, PREFETCH))
    run.steps(300, input_wait_s=0.03)
    (f,) = findings(run.engine(), "input-bound")
    assert f.advice.startswith(".map at train.py:41 runs one element at a time")
    assert f.evidence["fix_code_new"] == "ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE)"
    assert "prefetch" not in f.advice


def test_report_lists_the_pipeline_map(tmp_path):
    from tpuwatch import protocol
    from tpuwatch.console.report import build_report, render_text

    p = pipe(SOURCE, ("map", "", "ds = ds.map(decode)"), BATCH, PREFETCH)
    hello = protocol.Hello(protocol_version=protocol.PROTOCOL_VERSION, agent_version="0.1.0", run_id="r", t=1.0,
                           pid=1, host="h", worker="h:1", python_version="3.11", tf_version="2.21.0",
                           keras_version="3.15.0", script="train.py", argv=("train.py",))
    (tmp_path / "events.jsonl").write_bytes(b"".join(protocol.encode(m) for m in (hello, p)))
    report = build_report(tmp_path)
    (d,) = report["pipelines"]
    assert [s["stage"] for s in d["stages"]] == ["from_tensor_slices", "map", "batch", "prefetch"]
    assert d["stages"][1]["site"] == "train.py:41"
    text = render_text(report)
    assert "Input pipeline" in text and "train.py:41" in text and ".map()   ds = ds.map(decode)" in text


GENERATOR = ("from_generator", "", "ds = tf.data.Dataset.from_generator(examples, output_signature=sig)")


def test_a_generator_is_told_to_move_its_work_into_a_parallel_map():
    c = culprit(pipe(GENERATOR, BATCH, PREFETCH), fetch_in_step=True)
    assert (c.stage, c.site) == ("from_generator", "train.py:40")
    assert "num_parallel_calls=tf.data.AUTOTUNE" in c.fix and "TF ops" in c.fix


def test_a_generator_whose_work_is_in_a_parallel_map_is_not_told_to_move_it():
    # the advice applied (input_slow_generator.py's edit): what is left is the generator's yield
    c = culprit(pipe(GENERATOR, PARALLEL_MAP, BATCH, PREFETCH), fetch_in_step=True)
    assert (c.stage, c.site) == ("from_generator", "train.py:40")
    assert "num_parallel_calls" not in c.fix and "from_tensor_slices" in c.fix, c

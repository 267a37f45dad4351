"""The stage that starves the step, from the pipeline map: one edit naming its line, never what
the pipeline already has."""

from __future__ import annotations

import pytest
from diag_synthetic import SyntheticRun, findings

from tpuwatch.monitor.diagnostics.input_pipeline import with_measurement
from tpuwatch.monitor.diagnostics.pipeline_doctor import (
    culprit,
    measured_stage,
    own_times,
    pipeline_notes,
    stage_culprit,
    stage_of_iterators,
)
from tpuwatch.protocol import InputStages, Pipeline


def pipe(*stages: tuple[str, str, str], added_by: str = "", consumer: str = "iterator",
         consumer_site: str = "", tf_prefetch: bool | None = None, tf_parallel: tuple[bool, ...] = ()) -> Pipeline:
    """stages: (name, settings, code); stage i is at train.py:(40 + i)."""
    n = len(stages)
    return Pipeline(t=0.0, dataset=1, consumer=consumer, stages=tuple(s[0] for s in stages),
                    sites=tuple(f"train.py:{40 + i}" for i in range(n)),
                    settings=tuple(s[1] for s in stages), code=tuple(s[2] for s in stages),
                    holds_bytes=(0,) * n, added_by=(added_by,) * n, consumer_site=consumer_site,
                    tf_prefetch=tf_prefetch, tf_parallel=tf_parallel)


SOURCE = ("from_tensor_slices", "", "ds = tf.data.Dataset.from_tensor_slices((x, y))")
BATCH = ("batch", "batch_size=64, drop_remainder=False", "ds = ds.batch(64)")
PREFETCH = ("prefetch", "buffer_size=AUTOTUNE", "ds = ds.prefetch(tf.data.AUTOTUNE)")


def test_a_sequential_map_is_named_with_its_line_and_edit():
    c = culprit(pipe(SOURCE, ("map", "", "ds = ds.map(decode)"), BATCH, PREFETCH), fetch_in_step=True)
    assert (c.stage, c.site) == ("map", "train.py:41")
    assert c.new_code == "ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE)"
    assert "prefetch" not in c.fix  # it has one


def test_a_map_tensorflow_runs_in_parallel_is_not_told_to_add_num_parallel_calls():
    # a stateless map function: TF's map_parallelization runs it as ParallelMap(AUTOTUNE) (TF
    # 2.16 and 2.21, on by default); "add num_parallel_calls" would change nothing
    p = pipe(SOURCE, ("map", "", "ds = ds.map(decode)"), BATCH, PREFETCH, tf_parallel=(False, True, False, False))
    c = culprit(p, fetch_in_step=True)
    assert c.stage == "" and "num_parallel_calls" not in c.fix and not c.new_code, c
    assert stage_culprit(p, 1) is None
    assert pipeline_notes(p) == ["TensorFlow runs .map at train.py:41 in parallel (its function is stateless)"]


def test_a_map_before_the_cache_runs_once_and_is_not_blamed():
    c = culprit(pipe(SOURCE, ("map", "", "ds = ds.map(decode)"), ("cache", "filename=''", "ds = ds.cache()"),
                     BATCH, PREFETCH), fetch_in_step=True)
    assert c.stage == ""


@pytest.mark.parametrize("tf_prefetch", [True, None])
def test_no_prefetch_is_advised_where_tensorflow_adds_one(tf_prefetch):
    # TF's inject_prefetch puts prefetch(AUTOTUNE) after the last stage (TF 2.16 and 2.21, on by
    # default): "end it with .prefetch" was advised and changed nothing (a custom loop over
    # shuffle().batch(), the guides' shape: 30% waiting before the edit, 30% after)
    c = culprit(pipe(SOURCE, ("shuffle", "buffer_size=1024", "ds = ds.shuffle(1024)"), BATCH,
                     tf_prefetch=tf_prefetch), fetch_in_step=True)
    assert c.stage != "prefetch" and "prefetch(" not in c.fix and not c.new_code, c


def test_no_prefetch_at_the_end_is_added_where_the_options_turn_tensorflows_off():
    c = culprit(pipe(SOURCE, ("shuffle", "buffer_size=1024", "ds = ds.shuffle(1024)"), BATCH,
                     tf_prefetch=False), fetch_in_step=True)
    assert (c.stage, c.site) == ("prefetch", "train.py:42")
    assert c.new_code == "ds = ds.batch(64).prefetch(tf.data.AUTOTUNE)"
    assert "options turn off" in c.problem, c


def test_a_python_for_loop_over_the_dataset_is_the_eager_fetch():
    p = pipe(SOURCE, ("shuffle", "buffer_size=1024", "ds = ds.shuffle(1024)"), BATCH, consumer_site="train.py:60",
             tf_prefetch=True)
    c = culprit(p, fetch_in_step=False)
    assert (c.stage, c.site, c.overlapped) == ("", "train.py:60", True), c
    assert "TensorFlow prefetches after its last stage, .batch" in c.problem, c
    assert "eager fetch of each batch between steps, in Python at train.py:60" in c.problem, c
    assert "next(iterator)" in c.fix and "prefetch(" not in c.fix, c
    # an iterator made with iter() may be fetched in a tf.function: the fetch is not blamed
    c = culprit(pipe(SOURCE, BATCH), fetch_in_step=False)
    assert c.site == "" and "eager fetch" not in c.problem, c


PARALLEL_MAP = ("map", "num_parallel_calls=AUTOTUNE, deterministic='default'",
                "ds = ds.map(f, num_parallel_calls=tf.data.AUTOTUNE)")


def test_the_maps_notes_say_what_the_stages_do_not_show():
    with_options = ("with_options", "", "ds = ds.with_options(options)")
    assert pipeline_notes(pipe(SOURCE, BATCH, with_options, tf_prefetch=True)) == [
        "TensorFlow adds .prefetch(AUTOTUNE) after .batch"]
    assert pipeline_notes(pipe(SOURCE, BATCH, with_options, tf_prefetch=False)) == [
        "no .prefetch: the dataset's options turn off the one TensorFlow adds after .batch"]
    assert pipeline_notes(pipe(SOURCE, BATCH, with_options)) == []  # options not known (an old recording)
    assert pipeline_notes(pipe(SOURCE, BATCH, PREFETCH, consumer_site="train.py:60")) == [
        "each batch fetched eagerly, between steps, at train.py:60"]


def test_the_notes_claim_no_prefetch_after_a_stage_that_runs_ahead():
    # TF (2.16, 2.21) injects no prefetch after a parallel map, a parallel interleave or a fused
    # map-and-batch (the review, checked with assert_next): they run ahead by themselves
    assert pipeline_notes(pipe(SOURCE, PARALLEL_MAP, BATCH, tf_prefetch=True)) == []
    assert pipeline_notes(pipe(SOURCE, ("map", "", "ds = ds.map(f)"), BATCH, tf_prefetch=True,
                               tf_parallel=(False, True, False))) == [
        "TensorFlow runs .map at train.py:41 in parallel (its function is stateless)"]


def test_a_distributed_datasets_own_prefetch_and_map_are_not_the_scripts():
    # tf.distribute ends the dataset with .rebatch().prefetch(replicas) and maps it itself: with
    # autotune off a batch is still made ahead, and its map is no note about the script's code
    p = Pipeline(t=0.0, dataset=1, consumer="experimental_distribute_dataset",
                 stages=("from_tensor_slices", "shuffle", "batch", "map", "rebatch", "prefetch", "autoshard"),
                 sites=("train.py:40", "train.py:41", "train.py:42") + ("train.py:60",) * 4,
                 settings=("", "buffer_size=1024", "batch_size=64, drop_remainder=True", "", "", "buffer_size=2", ""),
                 code=("", "", "ds = ds.batch(64, drop_remainder=True)") + ("dist = ...",) * 4,
                 holds_bytes=(0,) * 7, added_by=("", "", "", "tf.distribute", "tf.distribute", "tf.distribute",
                                                 "tensorflow"),
                 tf_prefetch=False, tf_parallel=(False, False, False, True, False, False, False))
    assert culprit(p, fetch_in_step=True).stage != "prefetch"
    assert pipeline_notes(p) == []


@pytest.mark.parametrize("stages", [
    (SOURCE, PARALLEL_MAP, BATCH),  # tf.data fuses them into one parallel map-and-batch
    (SOURCE, PARALLEL_MAP, BATCH, ("repeat", "count=-1", "ds = ds.repeat()")),
    (SOURCE, BATCH, PARALLEL_MAP),
    (SOURCE, ("interleave", "cycle_length=4, block_length=1, num_parallel_calls=AUTOTUNE",
              "ds = files.interleave(read, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)"), BATCH),
    (SOURCE, ("batch", "batch_size=64, num_parallel_calls=AUTOTUNE", "ds = ds.batch(64, num_parallel_calls=-1)"),),
], ids=["map-batch", "map-batch-repeat", "batch-map", "interleave-batch", "parallel-batch"])
def test_no_final_prefetch_is_advised_after_a_parallel_last_stage(stages):
    # the parallel stage runs ahead by itself (TF's inject_prefetch adds none after it):
    # bench/prefetch_after_parallel_map.py measured no wait cut by adding one
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
    c = culprit(pipe(SOURCE, BATCH, PREFETCH, consumer="experimental_distribute_dataset",
                     consumer_site="train.py:60"), fetch_in_step=False)
    assert "eager fetch of each distributed batch between steps, in Python at train.py:60" in c.problem
    assert "next(iterator)" in c.fix and c.site == "train.py:60"
    assert "prefetch" not in c.fix and "num_parallel_calls" not in c.fix
    # an iterator the script made with iter() and hands to its tf.function fetches in the step
    # (its function is not one of Keras'): no eager fetch was seen, so none is blamed (before:
    # blamed, with its iter() line)
    c = culprit(pipe(SOURCE, BATCH, PREFETCH, consumer="experimental_distribute_dataset"), fetch_in_step=False)
    assert "eager fetch" not in c.problem and "next(iterator)" not in c.fix, c


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
    from tpuwatch.console.report import build_model, build_report, render_text

    p = pipe(SOURCE, ("map", "", "ds = ds.map(decode)"), BATCH, PREFETCH)
    hello = protocol.Hello(protocol_version=protocol.PROTOCOL_VERSION, agent_version="0.1.0", run_id="r", t=1.0,
                           pid=1, host="h", worker="h:1", python_version="3.11", tf_version="2.21.0",
                           keras_version="3.15.0", script="train.py", argv=("train.py",))
    (tmp_path / "events.jsonl").write_bytes(b"".join(protocol.encode(m) for m in (hello, p)))
    report = build_report(tmp_path)
    (d,) = report["pipelines"]
    assert [s["stage"] for s in d["stages"]] == ["from_tensor_slices", "map", "batch", "prefetch"]
    assert d["stages"][1]["site"] == "train.py:41"
    text = render_text(build_model(tmp_path))
    assert "Input pipeline" in text and "train.py:41" in text and ".map()   ds = ds.map(decode)" in text


def test_a_pipeline_said_again_with_its_fetch_line_replaces_the_first(tmp_path):
    # the agent says a dataset's pipeline when its iterator is made, and again once the script
    # has fetched batches eagerly at one line: one pipeline, with that line, in the map and the finding
    import dataclasses

    from tpuwatch import protocol
    from tpuwatch.console.report import build_report

    p = pipe(SOURCE, ("shuffle", "buffer_size=1024", "ds = ds.shuffle(1024)"), BATCH, tf_prefetch=True)
    run = SyntheticRun(step_time_s=0.002)
    run.emit(p)
    run.emit(dataclasses.replace(p, consumer_site="train.py:60"))
    run.steps(300, input_wait_s=0.0008)
    (f,) = findings(run.engine(), "input-bound")
    assert f.evidence["culprit_site"] == "train.py:60" and "eager fetch" in f.advice, f
    hello = protocol.Hello(protocol_version=protocol.PROTOCOL_VERSION, agent_version="0.1.0", run_id="r", t=1.0,
                           pid=1, host="h", worker="h:1", python_version="3.11", tf_version="2.21.0",
                           keras_version="3.15.0", script="train.py", argv=("train.py",))
    again = dataclasses.replace(p, consumer_site="train.py:60")
    (tmp_path / "events.jsonl").write_bytes(b"".join(protocol.encode(m) for m in (hello, p, again)))
    (d,) = build_report(tmp_path)["pipelines"]
    assert d["consumer_site"] == "train.py:60"


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


# --- the stage measured by the auto-profile (protocol.InputStages) --------------------------------

def stages_of(*rows: tuple) -> InputStages:
    """An auto-profile's iterators as the agent sends them (names after tf.data's rewrites): rows
    of (name, self time, whole duration; the self time when left out)."""
    return InputStages(t=0.0, path="/r/profiles/plugins/profile/1", step_from=39, step_to=50, capture_s=1.35,
                       fetch_s=0.22, iterators=tuple(r[0] for r in rows), self_s=tuple(r[1] for r in rows),
                       calls=(1,) * len(rows), busy_s=tuple(r[-1] for r in rows), step_time_before_s=0.114,
                       step_time_inside_s=0.089, step_time_after_s=0.117)


SEQUENTIAL_MAP = pipe(SOURCE, ("shuffle", "buffer_size=4096", "ds = ds.shuffle(4096).repeat()"),
                      ("repeat", "count=-1", "ds = ds.shuffle(4096).repeat()"), ("map", "", "ds = ds.map(decode)"),
                      BATCH, ("prefetch", "buffer_size=2", "ds = ds.prefetch(2)"))
# recorded from input_sequential_map.py's auto-profile (TF 2.21): map and batch run fused, shuffle
# and repeat too; Prefetch's self time is its consumer waiting for the map
SEQUENTIAL_MAP_CAPTURE = stages_of(
    ("Root", 0.000241, 0.220755), ("Root::Prefetch", 0.220514), ("Root::Prefetch::MapAndBatch", 1.029747),
    ("Root::Prefetch::MapAndBatch::ShuffleAndRepeat", 0.004536, 0.012068),
    ("Root::Prefetch::MapAndBatch::ShuffleAndRepeat::TensorSlice", 0.007532))


def test_iterators_map_onto_the_pipeline_stages_in_chain_order():
    owners = stage_of_iterators(SEQUENTIAL_MAP, SEQUENTIAL_MAP_CAPTURE.iterators)
    # Root and the consumer side of Prefetch wait; the fused map-and-batch is the map's (41+2),
    # shuffle-and-repeat the shuffle's
    assert owners == [None, None, 3, 1, 0]
    ms = measured_stage(SEQUENTIAL_MAP, SEQUENTIAL_MAP_CAPTURE)
    assert (ms.stage, ms.site) == ("map", "train.py:43")
    # the map-and-batch's own time is its wait less its input's 12 ms on the map's thread; the
    # share is of every iterator's own time (the waits of Root and Prefetch left out)
    assert ms.own_s == pytest.approx(1.029747 - 0.012068)
    assert ms.share == pytest.approx(1.017679 / (1.017679 + 0.004536 + 0.007532))


def test_an_asynchronous_stage_waiting_for_its_input_is_not_blamed_for_the_input():
    # TFRecordDataset(files) without num_parallel_reads reads through a FlatMap over the file
    # names; the parallel map's consumer waits 0.95 s, 0.9 s of it for the reads on its threads
    p = pipe(("tensorslice", "", 'ds = tf.data.TFRecordDataset(files, compression_type="GZIP")'),
             ("tfrecord", "num_parallel_reads=None", 'ds = tf.data.TFRecordDataset(files, compression_type="GZIP")'),
             PARALLEL_MAP, BATCH, PREFETCH)
    m = stages_of(("Root", 0.001, 0.3), ("Root::Prefetch", 0.29, 0.3), ("Root::Prefetch::MapAndBatch", 0.95),
                  ("Root::Prefetch::MapAndBatch::FlatMap", 0.005, 0.9),
                  ("Root::Prefetch::MapAndBatch::FlatMap::TensorSlice", 0.0001),
                  ("Root::Prefetch::MapAndBatch::FlatMap[0]::TFRecord", 0.45),
                  ("Root::Prefetch::MapAndBatch::FlatMap[1]::TFRecord", 0.44))
    assert stage_of_iterators(p, m.iterators) == [None, None, 2, 1, 0, 1, 1]
    assert own_times(m)[2] == pytest.approx(0.05)
    ms = measured_stage(p, m)
    assert (ms.stage, ms.site) == ("tfrecord", "train.py:41")
    assert ms.share == pytest.approx(0.895 / 0.9451)


def test_an_interleaves_own_datasets_are_charged_to_the_interleave():
    p = pipe(SOURCE, ("interleave", "cycle_length=1, block_length=1", "ds = files.interleave(load, cycle_length=1)"),
             BATCH, PREFETCH)
    m = stages_of(("Root", 0.0005), ("Root::Prefetch", 0.0019), ("Root::Prefetch::BatchV2", 0.0022),
                  ("Root::Prefetch::BatchV2::Interleave", 0.0098), ("Root::Prefetch::BatchV2::Interleave::TensorSlice",
                                                                    0.0001),
                  ("Root::Prefetch::BatchV2::Interleave::Unbatch", 0.0026),
                  ("Root::Prefetch::BatchV2::Interleave::Unbatch::Map", 0.8152),
                  ("Root::Prefetch::BatchV2::Interleave::Unbatch::Map::FromTensor", 0.0001))
    assert stage_of_iterators(p, m.iterators) == [None, None, 2, 1, 0, 1, 1, 1]
    ms = measured_stage(p, m)
    assert (ms.stage, ms.site) == ("interleave", "train.py:41") and ms.share > 0.99


def test_the_finding_states_the_measured_stage_its_line_share_and_edit():
    run = SyntheticRun(step_time_s=0.05)
    run.emit(SEQUENTIAL_MAP)
    run.steps(150, input_wait_s=0.03)
    run.emit(SEQUENTIAL_MAP_CAPTURE)
    run.steps(150, input_wait_s=0.03)
    (f,) = findings(run.engine(), "input-bound")
    ev = f.evidence
    assert (ev["culprit_stage"], ev["culprit_site"]) == ("map", "train.py:43")
    assert (ev["measured_stage"], ev["measured_site"], ev["measured_share_pct"]) == ("map", "train.py:43", 99)
    assert ev["measured_own_ms"] == 1017.7
    assert ev["fix_code_new"] == "ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE)"
    assert ev["profile_steps"] == "39-50" and ev["profile_path"] == "/r/profiles/plugins/profile/1"
    assert (ev["auto_profile_step_time_ms_before"], ev["auto_profile_step_time_ms_inside"],
            ev["auto_profile_step_time_ms_after"]) == (114.0, 89.0, 117.0)
    assert "measured: 99% of the input pipeline's time in a profile of steps 39-50" in f.advice
    assert "measured_overrides" not in ev


def test_the_measured_stage_wins_over_the_pick_by_settings():
    # by its settings the sequential map is blamed first; the profile says the interleave reading
    # one shard at a time takes the time (the map is cheap)
    p = pipe(SOURCE, ("interleave", "cycle_length=1, block_length=1", "ds = files.interleave(load, cycle_length=1)"),
             ("map", "", "ds = ds.map(scale)"), BATCH, PREFETCH)
    assert culprit(p, fetch_in_step=True).stage == "map"
    run = SyntheticRun(step_time_s=0.05)
    run.emit(p)
    run.emit(stages_of(("Root", 0.001), ("Root::Prefetch", 0.3), ("Root::Prefetch::MapAndBatch", 0.95),
                       ("Root::Prefetch::MapAndBatch::Interleave", 0.02, 0.921),
                       ("Root::Prefetch::MapAndBatch::Interleave::TFRecord", 0.9),
                       ("Root::Prefetch::MapAndBatch::Interleave::TensorSlice", 0.001)))
    run.steps(300, input_wait_s=0.03)
    (f,) = findings(run.engine(), "input-bound")
    ev = f.evidence
    assert (ev["culprit_stage"], ev["culprit_site"]) == ("interleave", "train.py:41")
    assert (ev["static_stage"], ev["static_site"]) == ("map", "train.py:42")
    assert "the measured stage wins" in ev["measured_overrides"]
    # the interleave's 0.02 + 0.9 s of reads its datasets make, of the map's own 0.95 - 0.921 s too
    assert ev["measured_share_pct"] == round(100 * 0.92 / (0.92 + 0.029 + 0.001))
    assert ev["fix_code_new"] == ("ds = files.interleave(load, cycle_length=tf.data.AUTOTUNE, "
                                  "num_parallel_calls=tf.data.AUTOTUNE)")


def test_a_measured_stage_does_not_replace_the_eager_fetch_verdict():
    p = pipe(SOURCE, PARALLEL_MAP, BATCH, PREFETCH, consumer="experimental_distribute_dataset",
             consumer_site="train.py:60")
    c, ev = with_measurement(p, culprit(p, fetch_in_step=False),
                             stages_of(("Root", 0.001), ("Root::Prefetch", 0.01),
                                       ("Root::Prefetch::ParallelMapV2", 0.2),
                                       ("Root::Prefetch::ParallelMapV2::TensorSlice", 0.01)))
    assert "eager fetch" in c.problem and ev["measured_stage"] == "map"
    assert "the verdict above stands" in ev["measured_note"] and "measured_overrides" not in ev


def test_a_parallel_stage_measured_busiest_is_not_told_what_it_has():
    # the sequential map's edit applied (input_sequential_map.py): the map, parallel now, is
    # still the busiest stage; it has no edit to ask for, so the verdict by settings stands
    p = pipe(SOURCE, PARALLEL_MAP, BATCH, PREFETCH)
    static = culprit(p, fetch_in_step=True)
    c, ev = with_measurement(p, static, stages_of(("Root", 0.001), ("Root::Prefetch", 0.2, 0.3),
                                                  ("Root::Prefetch::MapAndBatch", 0.9),
                                                  ("Root::Prefetch::MapAndBatch::TensorSlice", 0.01)))
    assert c == static and c.stage == "" and "num_parallel_calls" not in c.fix
    assert (ev["measured_stage"], ev["measured_site"]) == ("map", "train.py:41")
    assert "parallel already" in ev["measured_note"] and "measured_overrides" not in ev


def test_a_fit_under_mirrored_strategy_is_measured_at_the_scripts_map():
    # recorded from input_bound.py (fit over 4 replicas, TF 2.21): the pipeline map lists what
    # tf.distribute added after the script's stages; each device's Generator waits on the host
    # pipeline's buffer; the fused map-and-batch is the script's map and batch, not the map
    # tf.distribute added
    n = 10
    p = Pipeline(t=0.0, dataset=1, consumer="experimental_distribute_dataset",
                 stages=("from_tensor_slices", "shuffle", "repeat", "map", "batch", "map", "restructured",
                         "rebatch", "prefetch", "autoshard"),
                 sites=("train.py:49",) * 3 + ("train.py:50",) * 2 + ("train.py:62",) * 5,
                 settings=("", "buffer_size=4096", "count=-1", "", "batch_size=128, drop_remainder=True", "", "",
                           "", "buffer_size=4", ""),
                 code=("ds = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(4096).repeat()",) * 3
                 + ("ds = ds.map(parse).batch(global_batch, drop_remainder=True)",) * 2 + ("model.fit(ds)",) * 5,
                 holds_bytes=(0,) * n, added_by=("",) * 5 + ("tf.distribute",) * 4 + ("tensorflow",))
    m = stages_of(("Root", 0.001605, 4.676503), ("Root::Prefetch", 4.674898), ("Root::Prefetch::Generator", 3.941878),
                  ("Root::Prefetch::Rebatch", 0.000154, 0.985052), ("Root::Prefetch::Rebatch::MapAndBatch", 0.984898),
                  ("Root::Prefetch::Rebatch::MapAndBatch::ShuffleAndRepeat", 0.008367, 0.021772),
                  ("Root::Prefetch::Rebatch::MapAndBatch::ShuffleAndRepeat::TensorSlice", 0.013404))
    assert stage_of_iterators(p, m.iterators) == [None, None, None, 7, 3, 1, 0]
    ms = measured_stage(p, m)
    assert (ms.stage, ms.site) == ("map", "train.py:50")
    own = 0.984898 - 0.021772
    assert ms.share == pytest.approx(own / (0.000154 + own + 0.008367 + 0.013404))
    c, ev = with_measurement(p, culprit(p, fetch_in_step=True), m)
    assert (c.stage, c.site) == ("map", "train.py:50") and ev["measured_share_pct"] == 98


@pytest.mark.parametrize("captured", [False, True])
def test_the_steps_inside_an_automatic_capture_are_left_out_of_the_figures(captured):
    # 10 ms steps; 60 steps six times slower while the profiler traces every op. Seen live on
    # healthy_fit.py (600 steps): its own capture raised a step-time-jitter warning (p95 64 ms,
    # 6.5x the median) that the same run without it did not have
    from tpuwatch.protocol import CommandState, Result

    run = SyntheticRun(step_time_s=0.01, time_noise=0.02)
    run.steps(300, input_wait_s=0.0)
    if captured:
        run.emit(CommandState(t=run.t, id="auto-profile-1", action="profile", state="queued", step=run.step))
        run.emit(CommandState(t=run.t, id="auto-profile-1", action="profile", state="running", step=run.step))
    run.steps(60, step_time_s=0.06, input_wait_s=0.0)
    if captured:
        run.emit(Result(t=run.t, id="auto-profile-1", action="profile", ok=True, message="captured",
                        details={"path": "/r/profiles/plugins/profile/1", "step": 301, "steps": 60}))
    run.steps(300, input_wait_s=0.0)
    jitter = findings(run.engine(), "step-time-jitter")
    assert (jitter == []) == captured, jitter


def test_the_input_wait_inside_an_automatic_capture_counts_in_the_runs_share():
    # the auto-profile starts when the wait rises: on a short run the waiting steps were all
    # inside its capture, and the finished run's report had no input-bound finding left
    from tpuwatch.protocol import CommandState, Result

    run = SyntheticRun(step_time_s=0.01, time_noise=0.02)
    run.steps(40, input_wait_s=0.0)
    run.emit(CommandState(t=run.t, id="auto-profile-1", action="profile", state="running", step=run.step))
    run.steps(60, step_time_s=0.06, input_wait_s=0.02)
    run.emit(Result(t=run.t, id="auto-profile-1", action="profile", ok=True, message="captured",
                    details={"path": "/r/profiles/plugins/profile/1", "step": 41, "steps": 60}))
    run.exit()
    (f,) = findings(run.engine(), "input-bound")
    assert f.evidence["input_wait_pct"] >= 20, f.evidence


def test_numpy_into_fit_measured_at_keras_own_map_is_not_advised_as_measured():
    # a new user's tryout (2026-11-26): fit on NumPy arrays, an info at 7%: the advice said "no
    # edit of the input overlaps more (measured: 100% of the input pipeline's time ...)" while
    # the evidence said "the verdict above stands: the wait is not the pipeline's stages". The
    # profile measured Keras' own map (its stages are named at the fit line): not the script's
    from dataclasses import replace

    keras_pipe = pipe(("range", "", ""), ("parallelmap", "num_parallel_calls=AUTOTUNE", ""),
                      ("prefetch", "buffer_size=AUTOTUNE", ""), added_by="keras")
    keras_pipe = replace(keras_pipe, sites=("train.py:40",) * 3)
    run = SyntheticRun(step_time_s=0.0016)
    run.emit(keras_pipe)
    run.steps(150, input_wait_s=0.00012, function="multi_step_on_iterator")
    run.emit(stages_of(("Root", 0.0001), ("Root::Prefetch", 0.001),
                       ("Root::Prefetch::ParallelMapV2", 0.05),
                       ("Root::Prefetch::ParallelMapV2::Range", 0.0001)))
    run.steps(150, input_wait_s=0.00012, function="multi_step_on_iterator")
    (f,) = findings(run.engine(), "input-bound")
    assert "NumPy" in f.advice and "measured:" not in f.advice, f.advice
    assert "Keras' own" in f.evidence["measured_note"], f.evidence

"""The goodput ledger (monitor/ledger.py) on recorded-shape telemetry with known amounts."""

from __future__ import annotations

import math

import pytest

from tpuwatch.monitor.ledger import (
    BUCKETS,
    LedgerBuilder,
    _ideal,
    as_dict,
    goodput_line,
    ledger_of,
    merge,
    note_of,
    phase_text,
    rows,
    teardown_lines,
)
from tpuwatch.monitor.state import RunState
from tpuwatch.protocol import Exit, Hello, Phase, Retrace, Step, Teardown

T0 = 1_750_000_000.0


class Timeline:
    """Messages as an agent sends them, on a clock that advances."""

    def __init__(self, worker: str = "h:1", launch_ahead_s: float = 0.5) -> None:
        self.t = T0
        self.step = 0
        self.worker = worker
        self.msgs: list = [
            Hello(protocol_version=1, agent_version="0", run_id="r", t=T0, pid=1, host="h", worker=worker,
                  python_version="3", tf_version="2.21.0", keras_version="3", script="s.py", argv=("s.py",)),
            Phase(t=T0, phase="starting", since=T0 - launch_ahead_s),
        ]

    def phase(self, name: str, detail: str = "", calls: int = 0, since: float | None = None) -> None:
        self.msgs.append(Phase(t=self.t, phase=name, since=self.t if since is None else since, detail=detail,
                               step=self.step, calls=calls))

    def wait(self, s: float) -> None:
        self.t += s

    def steps(self, n: int, step_s: float, wait_s: float = 0.0, gap_s: float = 0.0, k: int = 1,
              retrace_first: bool = False) -> None:
        for i in range(n):
            self.t += gap_s
            start = self.t
            self.t += step_s * k
            if retrace_first and i == 0:
                self.msgs.append(Retrace(t=start + 0.5 * step_s, function="train_step", traces=1, instances=1,
                                         signature="x", change="", step=self.step))
            self.step += k
            self.msgs.append(Step(step=self.step, t=self.t, step_time_s=step_s, input_wait_s=wait_s, loss=1.0,
                                  steps=k, function="train_step"))
            if self.step == k:
                self.msgs.append(Phase(t=self.t, phase="training", since=start, detail="train_step", step=self.step))

    def exit(self, after_s: float) -> None:
        self.t += after_s
        self.msgs.append(Exit(t=self.t, exit_code=0))


def planted() -> Timeline:
    tl = Timeline()
    tl.wait(5.0)  # imports, building the data set: starting 5.5 s with the launch 0.5 s ahead
    tl.steps(1, 2.0, retrace_first=True)  # the first call traces: ~2 s compiling
    tl.steps(200, 0.010, wait_s=0.002, gap_s=0.001)  # 200 x (8 ms compute + 2 ms wait), 1 ms host gaps
    tl.phase("evaluating", "test_step")
    since = tl.t
    for calls in range(1, 41):
        tl.wait(0.5)
        tl.phase("evaluating", "test_step", calls, since=since)  # 20 s of evaluation
    tl.phase("checkpointing", "CheckpointManager.save")
    tl.wait(3.0)
    tl.phase("host")
    tl.wait(0.5)  # a callback sleeping
    tl.phase("iterator", "DistributedDataset.__iter__")
    tl.wait(1.5)
    tl.phase("host")
    tl.steps(100, 0.010, wait_s=0.002, gap_s=0.001)
    tl.wait(30.0)  # a hang between two steps
    tl.steps(10, 0.010, wait_s=0.002, gap_s=0.001)
    tl.phase("finishing")
    tl.exit(2.0)
    return tl


def test_every_planted_amount_lands_in_its_bucket_and_the_buckets_sum_to_the_wall_time():
    tl = planted()
    hang_start = next(m.t for m in tl.msgs if isinstance(m, Step) and m.step == 301)
    lg = ledger_of(tl.msgs, stalls={"h:1": [(hang_start, hang_start + 30.0 + 0.001)]})
    b = lg.buckets
    assert lg.ended and lg.steps == 311
    assert lg.wall_s == pytest.approx(tl.t - (T0 - 0.5))
    assert sum(b.values()) == pytest.approx(lg.wall_s, rel=1e-9)
    assert abs(b["unaccounted"]) < 0.01 * lg.wall_s
    assert lg.ideal_step_s == pytest.approx(0.008, rel=0.01)  # compute time: step less its wait
    assert b["starting"] == pytest.approx(5.5, abs=0.01)
    assert b["compiling"] == pytest.approx(2.0 - 0.008, abs=0.01)
    assert b["training"] == pytest.approx(311 * 0.008, rel=0.01)
    assert b["input_wait"] == pytest.approx(310 * 0.002, rel=0.01)
    assert b["above_ideal"] == pytest.approx(0.0, abs=0.01)
    assert b["evaluating"] == pytest.approx(20.0, abs=0.01)
    assert b["checkpointing"] == pytest.approx(3.0, abs=0.01)
    assert b["iterator"] == pytest.approx(1.5, abs=0.01)
    assert b["stalled"] == pytest.approx(30.0, abs=0.01)
    assert b["host"] == pytest.approx(0.5 + 310 * 0.001, abs=0.02)
    assert b["finishing"] == pytest.approx(2.0, abs=0.01)
    assert lg.goodput == pytest.approx(b["training"] / lg.wall_s)


def test_without_stall_episodes_the_hang_is_host_time():
    lg = ledger_of(planted().msgs)
    assert lg.buckets["stalled"] == 0.0 and lg.buckets["host"] == pytest.approx(30.8, abs=0.05)


def test_the_ideal_step_is_the_mean_at_or_below_median_plus_3_mad_for_microsecond_steps():
    # 900 steps of 200-210 µs and 100 slow ones of 5 ms: the slow ones are above the ideal
    tl = Timeline()
    for i in range(900):
        tl.steps(1, 200e-6 + (i % 11) * 1e-6)
    tl.steps(100, 5e-3)
    tl.exit(0.1)
    lg = ledger_of(tl.msgs)
    assert lg.ideal_step_s == pytest.approx(205e-6, rel=0.01)
    assert lg.buckets["above_ideal"] == pytest.approx(100 * (5e-3 - 205e-6), rel=0.02)
    assert lg.buckets["training"] == pytest.approx(1000 * 205e-6, rel=0.01)


def test_ideal_by_hand():
    # steps 1,1,1,2,100 (weights 1): median 1, MAD 0, limit 1: mean of the three 1s
    bins = {}
    b = LedgerBuilder()
    for x in (1.0, 1.0, 1.0, 2.0, 100.0):
        b._step(Step(step=1, t=T0 + 1000, step_time_s=x, input_wait_s=0.0, loss=None))
    bins = b._bins
    assert _ideal(bins) == pytest.approx(1.0, rel=0.006)


def test_steps_per_execution_records_count_their_steps():
    tl = Timeline()
    tl.steps(50, 0.004, k=8)  # each record: 8 steps of 4 ms
    tl.exit(0.0)
    lg = ledger_of(tl.msgs)
    assert lg.steps == 400 and lg.buckets["training"] == pytest.approx(400 * 0.004, rel=0.01)


def test_live_ledger_runs_to_now_and_books_the_time_since_the_last_step_as_host():
    tl = Timeline()
    tl.wait(2.0)
    tl.steps(10, 0.1)
    b = LedgerBuilder()
    for m in tl.msgs:
        b.apply(m)
    lg = b.ledger(now=tl.t + 7.0)
    assert not lg.ended
    assert lg.wall_s == pytest.approx(tl.t + 7.0 - (T0 - 0.5))
    assert lg.buckets["host"] == pytest.approx(7.0, abs=0.01) and lg.buckets["finishing"] == 0.0
    assert sum(lg.buckets.values()) == pytest.approx(lg.wall_s)


def test_merged_over_workers_each_bucket_is_the_workers_mean():
    a, b = planted(), planted()
    b.worker = "h:2"
    msgs = [("h:1", m) for m in a.msgs] + [("h:2", m) for m in b.msgs]
    lg = ledger_of(msgs)
    one = ledger_of(a.msgs)
    assert lg.workers == 2 and [n for n, _ in lg.per_worker] == ["h:1", "h:2"]
    for k in BUCKETS:
        assert lg.buckets[k] == pytest.approx(one.buckets[k])
    assert merge([]) is None


def test_the_run_state_shows_the_same_ledger_as_the_recording():
    tl = planted()
    state = RunState(clock=lambda: tl.t)
    for m in tl.msgs:
        state.apply(m)
    snap = state.snapshot(tl.t)
    direct = ledger_of(tl.msgs)
    assert snap.ledger is not None
    for k in BUCKETS:
        assert snap.ledger.buckets[k] == pytest.approx(direct.buckets[k])
    assert snap.phase == "finishing"


def test_text():
    lg = ledger_of(planted().msgs)
    line = goodput_line(lg)
    assert line.startswith("goodput 3.") and "host between steps" in line and "evaluating" in line
    labelled = {r.bucket: r.rule for r in rows(lg, ["input-bound"])}
    assert labelled["input_wait"] == "input-bound" and labelled["evaluating"] == ""
    assert phase_text("evaluating", T0, T0 + 151) == "evaluating 2:31"
    assert math.isclose(sum(r.share for r in rows(lg, all_buckets=True)), 1.0)


def test_an_evaluation_whose_calls_stop_is_stalled_from_its_last_call():
    tl = Timeline()
    tl.steps(10, 0.01)
    tl.phase("evaluating", "test_step")
    since = tl.t
    tl.wait(2.0)
    tl.phase("evaluating", "test_step", 5, since=since)
    last_call = tl.t
    tl.wait(40.0)  # the evaluation's calls stopped: hung
    tl.steps(1, 0.01)
    tl.exit(0.0)
    lg = ledger_of(tl.msgs, stalls={"h:1": [(last_call, last_call + 40.0)]})
    assert lg.buckets["evaluating"] == pytest.approx(2.0, abs=0.01)
    assert lg.buckets["stalled"] == pytest.approx(40.0, abs=0.01)
    assert sum(lg.buckets.values()) == pytest.approx(lg.wall_s)


def test_the_run_lasts_one_figure_in_the_summary_the_report_and_the_ledger(tmp_path):
    """The headless summary's "after X", the report's duration and the ledger's wall time are one
    figure, from the launch. Before: the summary and the report counted from the agent's hello, the
    ledger from the process's creation (0.5 s earlier here; seconds with a slow import)."""
    from monitor_recordings import write_run

    from tpuwatch.console import headless, report
    from tpuwatch.units import fmt_duration

    tl = planted()
    state = RunState()
    for m in tl.msgs:
        state.apply(m)
    snap = state.snapshot()
    assert snap.ledger is not None and snap.ledger.wall_s == pytest.approx(tl.t - (T0 - 0.5))
    assert snap.started_t == pytest.approx(T0 - 0.5)
    assert f"after {fmt_duration(snap.ledger.wall_s)}" in headless.summary(snap).splitlines()[0]
    rep = report.build_report(write_run(tmp_path / "r", tl.msgs))
    assert rep["run"]["duration_s"] == pytest.approx(rep["ledger"]["wall_s"], abs=1e-6)


def test_steps_whose_input_wait_was_not_read_are_booked_at_the_wait_of_the_read_that_covers_them():
    # the README sample (keras_fit.py, 2026-11-26): after the first 256 records the in-graph
    # wait is read at most every 0.25 s of training, and a read's wait is spread over the steps
    # since the last one, the others recorded None. With 151 ms steps of which 140 ms wait, every
    # other record had None: the ledger booked input wait 63 s (42%) and "step above ideal" 63 s
    # (43%) for what was 126 s of waiting; the summary said 88% of step time waits for input
    tl = Timeline()
    tl.wait(1.0)
    tl.steps(300, 0.011, wait_s=0.0001)
    for i in range(600):
        start = tl.t
        tl.t += 0.151
        tl.step += 1
        read = i % 2 == 1  # this read covers this step and the one before, unread
        tl.msgs.append(Step(step=tl.step, t=tl.t, step_time_s=0.151, input_wait_s=0.140 if read else None,
                            loss=1.0, steps=1, function="train_step"))
        assert tl.t - start == pytest.approx(0.151)
    tl.steps(1, 0.151, wait_s=None)  # the last record, its read not come: booked at the last read's
    tl.exit(0.5)
    lg = ledger_of(tl.msgs)
    b = lg.buckets
    assert b["input_wait"] == pytest.approx(601 * 0.140 + 300 * 0.0001, rel=0.01)
    assert lg.ideal_step_s == pytest.approx(0.011, rel=0.02)
    assert b["above_ideal"] == pytest.approx(0.0, abs=0.05)
    assert sum(b.values()) == pytest.approx(lg.wall_s, rel=1e-9) and abs(b["unaccounted"]) < 0.01


def test_a_run_whose_input_wait_is_never_read_books_none():
    tl = Timeline()
    tl.steps(100, 0.01, wait_s=None)
    tl.exit(0.1)
    lg = ledger_of(tl.msgs)
    assert lg.buckets["input_wait"] == 0.0 and lg.ideal_step_s == pytest.approx(0.01, rel=0.01)


def test_a_read_books_the_unread_steps_of_its_own_function_only():
    tl = Timeline()
    for _ in range(100):
        tl.t += 0.1
        tl.step += 1
        tl.msgs.append(Step(step=tl.step, t=tl.t, step_time_s=0.1, input_wait_s=None, loss=1.0, steps=1,
                            function="never_read"))
        tl.t += 0.1
        tl.step += 1
        tl.msgs.append(Step(step=tl.step, t=tl.t, step_time_s=0.1, input_wait_s=0.05, loss=1.0, steps=1,
                            function="train_step"))
    tl.exit(0.1)
    assert ledger_of(tl.msgs).buckets["input_wait"] == pytest.approx(100 * 0.05, rel=0.01)


def test_the_measured_input_wait_of_the_step_that_traced_is_input_wait_not_compiling():
    # a fit whose first batch waited 8.6 s for its shuffle buffer: that call traced too, and the
    # whole call was booked as compiling
    tl = Timeline()
    tl.wait(2.0)
    tl.steps(1, 10.0, wait_s=8.6, retrace_first=True)  # 8.6 s waiting for the batch, 1.4 s tracing
    tl.steps(100, 0.010, wait_s=0.0, gap_s=0.001)
    tl.phase("finishing")
    tl.exit(0.5)
    b = ledger_of(tl.msgs).buckets
    assert b["input_wait"] == pytest.approx(8.6, abs=0.01)
    assert b["compiling"] == pytest.approx(10.0 - 8.6 - 0.010, abs=0.01)
    assert b["training"] == pytest.approx(101 * 0.010, rel=0.01)


def test_python_after_the_last_step_is_host_until_the_script_returns():
    # fit returned (its iterator's teardown, then the script's own Python) 20 s before main did:
    # that was "finishing", while the live phase said host
    tl = Timeline()
    tl.wait(1.0)
    tl.steps(50, 0.010, gap_s=0.001)
    tl.wait(12.0)  # after the last step, the script still runs
    tl.phase("evaluating", "predict_step")
    tl.wait(8.0)  # predict
    tl.phase("host")
    tl.wait(1.0)
    tl.phase("finishing")  # main returned
    tl.exit(0.7)
    b = ledger_of(tl.msgs).buckets
    assert b["host"] == pytest.approx(12.0 + 1.0 + 49 * 0.001, abs=0.01)
    assert b["evaluating"] == pytest.approx(8.0, abs=0.01)
    assert b["finishing"] == pytest.approx(0.7, abs=0.01)
    assert ledger_of(tl.msgs).host_after_last_s == pytest.approx(13.0, abs=0.01)  # not between steps
    # a recording without the agent's finishing phase (a run killed, an older agent): as before
    old = [m for m in tl.msgs if not (isinstance(m, Phase) and m.phase == "finishing")]
    b = ledger_of(old).buckets
    assert b["finishing"] == pytest.approx(12.0 + 1.0 + 0.7, abs=0.01) and b["evaluating"] == pytest.approx(8.0)


# --- TensorFlow's iterator teardown (the agent's Teardown) ----------------------------------


def teardown(tl: Timeline, seconds: float, cpu_s: float = 0.01,
             stack: tuple[str, ...] = ("t.py:48 in main: del it",), site: str = "") -> None:
    """The training thread spends ``seconds`` deleting an iterator; the agent's message follows."""
    since = tl.t
    tl.wait(seconds)
    tl.msgs.append(Teardown(t=tl.t, since=since, cpu_s=cpu_s, iterator="OwnedIterator", step=tl.step, stack=stack,
                            site=site))


def epochs_with_a_pause(pause_s: float, host_s: float = 0.5) -> Timeline:
    tl = Timeline()
    tl.wait(2.0)
    tl.steps(50, 0.01, gap_s=0.001)
    tl.wait(host_s)  # the script's Python at the epoch boundary
    teardown(tl, pause_s)
    tl.steps(50, 0.01, gap_s=0.001)
    tl.phase("finishing")
    tl.exit(0.25)
    return tl


def test_a_long_pause_at_an_epoch_boundary_is_iterator_teardown_not_host():
    tl = epochs_with_a_pause(19.5)
    lg = ledger_of(tl.msgs)
    assert lg is not None
    assert lg.buckets["teardown"] == pytest.approx(19.5, abs=1e-6)
    assert lg.buckets["host"] == pytest.approx(0.5 + 99 * 0.001, abs=1e-3)  # the boundary's Python stays host
    assert sum(lg.buckets.values()) == pytest.approx(lg.wall_s, abs=1e-6)
    assert abs(lg.buckets["unaccounted"]) < 1e-6
    (note,) = lg.teardowns
    assert note.seconds == pytest.approx(19.5) and note.step == 50 and not note.after_last
    assert note.cpu_share == pytest.approx(0.01 / 19.5)
    assert [r.label for r in rows(lg)].count("iterator teardown") == 1


def test_a_short_gap_with_a_teardown_inside_books_it_too():
    lg = ledger_of(epochs_with_a_pause(2.5, host_s=0.1).msgs)
    assert lg is not None
    assert lg.buckets["teardown"] == pytest.approx(2.5, abs=1e-6)
    assert sum(lg.buckets.values()) == pytest.approx(lg.wall_s, abs=1e-6)


def test_a_teardown_at_the_script_end_comes_out_of_host_after_the_last_step():
    tl = Timeline()
    tl.wait(1.0)
    tl.steps(20, 0.01)
    tl.wait(0.2)
    teardown(tl, 5.0, stack=())
    tl.phase("finishing")
    tl.exit(0.3)
    lg = ledger_of(tl.msgs)
    assert lg is not None
    assert lg.buckets["teardown"] == pytest.approx(5.0, abs=1e-6)
    assert lg.buckets["host"] == pytest.approx(0.2, abs=1e-6)
    assert lg.buckets["finishing"] == pytest.approx(0.3, abs=1e-6)
    assert sum(lg.buckets.values()) == pytest.approx(lg.wall_s, abs=1e-6)
    (note,) = lg.teardowns
    assert note.after_last
    assert teardown_lines(lg.teardowns)[0].startswith("iterator teardown 5.00 s after step 20 (the last), 0% CPU")


def test_a_stall_episode_over_the_pause_leaves_the_teardown_named_and_books_each_second_once():
    tl = epochs_with_a_pause(19.5)
    pause = next(m for m in tl.msgs if isinstance(m, Teardown))
    state = RunState()
    state.apply_all(tl.msgs)
    # the stall rule's episode covers the boundary's Python and the pause
    builder = state.telemetry.worker("h:1").ledger
    lg = builder.ledger([(pause.since - 0.5, pause.t)])
    assert lg.buckets["teardown"] == pytest.approx(19.5, abs=1e-6)
    assert lg.buckets["stalled"] == pytest.approx(0.5, abs=1e-6)
    assert sum(lg.buckets.values()) == pytest.approx(lg.wall_s, abs=1e-6)
    assert min(lg.buckets.values()) >= -1e-5  # unix times in floats: ~1e-7 s each


def test_live_the_pause_is_host_until_its_message_comes_then_teardown():
    tl = Timeline()
    tl.wait(1.0)
    tl.steps(20, 0.01)
    state = RunState()
    state.apply_all(tl.msgs)
    lg = state.telemetry.worker("h:1").ledger.ledger(now=tl.t + 3.0)
    assert lg.buckets["teardown"] == 0.0 and lg.buckets["host"] >= 3.0
    teardown(tl, 3.0)
    state.apply(tl.msgs[-1])
    lg = state.telemetry.worker("h:1").ledger.ledger(now=tl.t + 0.5)
    assert lg.buckets["teardown"] == pytest.approx(3.0, abs=1e-6)
    assert sum(lg.buckets.values()) == pytest.approx(lg.wall_s, abs=1e-6)


def test_a_teardown_inside_an_evaluation_is_named_too():
    tl = Timeline()
    tl.wait(1.0)
    tl.steps(20, 0.01)
    tl.phase("evaluating", "test_step")
    teardown(tl, 3.0)
    tl.phase("host")
    tl.steps(5, 0.01)
    tl.exit(0.1)
    lg = ledger_of(tl.msgs)
    assert lg is not None
    assert lg.buckets["teardown"] == pytest.approx(3.0, abs=1e-6) and lg.buckets["evaluating"] < 1e-6
    assert sum(lg.buckets.values()) == pytest.approx(lg.wall_s, abs=1e-6)
    (note,) = lg.teardowns
    assert note.step == 20


def test_the_text_says_what_it_is_with_the_stack_line_and_the_json_reads_back():
    lg = ledger_of(epochs_with_a_pause(19.5).msgs)
    assert lg is not None
    (line,) = teardown_lines(lg.teardowns)
    assert line.startswith("iterator teardown 19.50 s after step 50, 0% CPU")
    assert "waits, idle, for tf.data's own threads" in line and line.endswith("at t.py:48 in main: del it")
    d = as_dict(lg)
    assert d["buckets_s"]["teardown"] == pytest.approx(19.5)  # type: ignore[index]
    assert teardown_lines([note_of(x) for x in d["teardowns"]]) == [line]  # type: ignore[union-attr]
    assert BUCKETS.index("teardown") == BUCKETS.index("iterator") + 1


def test_a_busy_teardown_is_not_called_idle():
    tl = Timeline()
    tl.steps(5, 0.01)
    teardown(tl, 4.0, cpu_s=3.0)
    tl.exit(0.1)
    lg = ledger_of(tl.msgs)
    assert lg is not None
    (line,) = teardown_lines(lg.teardowns)
    assert ", 75% CPU" in line and "idle" not in line


def test_merged_notes_name_their_worker():
    a, b = epochs_with_a_pause(3.0), Timeline(worker="h:2")
    b.wait(2.0)
    b.steps(100, 0.01, gap_s=0.001)
    b.exit(3.8)
    lg = ledger_of([("h:1", m) for m in a.msgs] + [("h:2", m) for m in b.msgs])
    assert lg is not None and lg.workers == 2
    (note,) = lg.teardowns
    assert note.worker == "h:1"
    assert lg.buckets["teardown"] == pytest.approx(1.5, abs=1e-6)  # the workers' mean
    assert " on h:1, " in teardown_lines(lg.teardowns)[0]


def test_the_line_quoted_is_the_scripts_when_keras_dropped_the_iterator():
    tl = Timeline()
    tl.steps(5, 0.01)
    teardown(tl, 3.0, stack=("traceback_utils.py:117 in error_handler: return fn(*args, **kwargs)",
                             "train.py:14 in <module>: model.fit(ds, epochs=2)"),
             site="train.py:14 in <module>: model.fit(ds, epochs=2)")
    tl.exit(0.1)
    lg = ledger_of(tl.msgs)
    assert lg is not None
    (line,) = teardown_lines(lg.teardowns)
    assert line.endswith("; at train.py:14 in <module>: model.fit(ds, epochs=2)")
    assert teardown_lines(lg.teardowns, short=True) == [
        "  3.00 s after step 5 (the last), 0% CPU: tf.data iterator deleted at train.py:14"]


def test_live_a_teardown_under_way_is_named_as_it_goes_and_its_end_replaces_it():
    tl = Timeline()
    tl.wait(1.0)
    tl.steps(20, 0.01)
    since = tl.t
    state = RunState()
    state.apply_all(tl.msgs)
    for seconds in (2.0, 3.0):  # the agent's thread, every second past 2 s
        state.apply(Teardown(t=since + seconds, since=since, cpu_s=0.0, iterator="OwnedIterator", step=20,
                             under_way=True))
    lg = state.telemetry.worker("h:1").ledger.ledger(now=since + 3.4)
    assert lg.buckets["teardown"] == pytest.approx(3.0, abs=1e-6)
    assert sum(lg.buckets.values()) == pytest.approx(lg.wall_s, abs=1e-6)
    (note,) = lg.teardowns
    assert note.under_way and ", under way, " in teardown_lines(lg.teardowns)[0]
    # its end, then a late look from the agent's thread (sent before the end, read after it)
    state.apply(Teardown(t=since + 4.0, since=since, cpu_s=0.0, iterator="OwnedIterator", step=20))
    state.apply(Teardown(t=since + 3.9, since=since, cpu_s=0.0, iterator="OwnedIterator", step=20, under_way=True))
    tl.t = since + 4.5
    tl.steps(5, 0.01)
    tl.exit(0.1)
    for m in tl.msgs[-6:]:
        state.apply(m)
    lg = state.telemetry.worker("h:1").ledger.ledger()
    assert lg.buckets["teardown"] == pytest.approx(4.0, abs=1e-6)
    (note,) = lg.teardowns
    assert not note.under_way and note.step == 20 and not note.after_last
    assert sum(lg.buckets.values()) == pytest.approx(lg.wall_s, abs=1e-6)

"""The stacks the agent takes by itself when steps stop: once per stall, at the limit the run's
own cadence sets, never while a save or an evaluation progresses, with the training thread's line."""

from __future__ import annotations

import sys
import threading
import time
import traceback
from pathlib import Path

from tpuwatch.agent.runtime import Agent
from tpuwatch.agent.stacks import StackDumper, StallStacks, describe, stall_limit_s
from tpuwatch.protocol import StackDump


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(tmp_path: Path) -> tuple[Agent, StallStacks, Clock]:
    clock = Clock()
    agent = Agent(tmp_path, "r", clock=clock)
    watch = StallStacks(agent, StackDumper(agent), floor_s=2.0)
    watch.fixed_s = None  # the run's cadence, whatever the environment says
    return agent, watch, clock


def steps(watch: StallStacks, clock: Clock, n: int, every_s: float = 0.01, first: int = 1) -> None:
    for i in range(n):
        clock.t += every_s
        watch.tap([(first + i, clock.t)])
    watch.agent.phases.current = "training"


def taken_while_main_waits(watch: StallStacks) -> list[StackDump]:
    """Runs the sampler on another thread while this (the main) thread waits on an event."""
    out: list[StackDump] = []
    ready = threading.Event()

    main = threading.get_ident()

    def sample() -> None:
        for _ in range(500):  # until the main thread waits (bounded: 5 s)
            frame = sys._current_frames().get(main)
            # in ready.wait itself (Thread.start waits on an Event of its own first)
            if frame is not None and frame.f_code.co_name == "wait" and frame.f_back is not None \
                    and frame.f_back.f_code.co_name == "taken_while_main_waits":
                break
            time.sleep(0.01)
        out.extend(watch())  # type: ignore[arg-type]
        ready.set()

    threading.Thread(target=sample, name="sampler").start()
    ready.wait(10)
    return out


def test_the_limit_is_the_runs_cadence_floored_and_never_past_the_live_limit():
    assert stall_limit_s([0.01] * 3, 2.0) == 60.0  # too few intervals: the live limit
    assert stall_limit_s([0.01] * 50, 2.0) == 3.0  # 300 x p95 (10 ms)
    assert stall_limit_s([0.001] * 50, 2.0) == 2.0  # the floor
    assert stall_limit_s([1.0] * 50, 2.0) == 60.0  # 300 s by the cadence: the live floor wins
    assert stall_limit_s([5.0] * 50, 2.0) == 100.0  # 20 x the median


def test_stacks_are_taken_once_a_stall_reaches_the_limit_and_name_the_waiting_line(tmp_path):
    agent, watch, clock = make(tmp_path)
    steps(watch, clock, 20)
    clock.t += 2.5
    assert watch() == []  # below 300 x 10 ms
    clock.t += 1.0
    (dump,) = taken_while_main_waits(watch)
    assert dump.reason == "stall" and dump.step == 20 and dump.gap_s == 3.5
    assert dump.stalled_in == "script"
    assert dump.headline == f"waiting at test_stall_stacks.py:{_line_of('ready.wait(10)')}: ready.wait(10)"
    text = Path(dump.path).read_text()
    assert "training thread: waiting at test_stall_stacks.py" in text and "[TRAINING THREAD]" in text
    assert Path(dump.path).parent == tmp_path / "stacks"
    # once per stall
    clock.t += 30
    assert watch() == []
    # the next stall gets its own
    steps(watch, clock, 5, first=21)
    clock.t += 4
    (again,) = taken_while_main_waits(watch)
    assert again.step == 25


def test_no_stacks_while_a_save_or_an_evaluation_progresses(tmp_path):
    agent, watch, clock = make(tmp_path)
    steps(watch, clock, 20)
    agent.phases.current = "checkpointing"
    clock.t += 50
    assert watch() == []
    # after the save, the quiet time counts from its end
    agent.phases.current, agent.phases.since = "host", clock.t
    clock.t += 2.0
    assert watch() == []
    clock.t += 1.5
    assert len(taken_while_main_waits(watch)) == 1


def _frames(*specs: tuple[str, int, str, str]) -> list[traceback.FrameSummary]:
    return [traceback.FrameSummary(path, line, name, line=code) for path, line, name, code in specs]


def test_what_the_training_thread_waits_in():
    roots = ("/venv/lib/python3.11/site-packages/",)
    tf = "/venv/lib/python3.11/site-packages/tensorflow/python"
    script = ("/home/u/train.py", 55, "main", "loss = train_step(iterator)")
    # inside a step call: native code below the tf.function's Python
    where = describe(_frames(script, (f"{tf}/eager/polymorphic_function/polymorphic_function.py", 833, "__call__", ""),
                             (f"{tf}/eager/execute.py", 53, "quick_execute", "")), roots)
    assert where.stalled_in == "step" and "train.py:55: loss = train_step(iterator)" in where.headline
    assert where.native_note.startswith("[native]")
    # an eager next() on an iterator
    where = describe(_frames(("/home/u/train.py", 40, "main", "x, y = next(it)"),
                             (f"{tf}/data/ops/iterator_ops.py", 826, "__next__", "")), roots)
    assert where.stalled_in == "input" and "train.py:40" in where.headline
    # no frame of the script's at all
    assert describe(_frames((f"{tf}/eager/execute.py", 53, "quick_execute", "")), roots).stalled_in == ""


def _line_of(code: str) -> int:
    (n,) = [i for i, text in enumerate(Path(__file__).read_text().splitlines(), start=1)
            if text.strip().startswith(code)]
    return n


def test_a_fixed_limit_from_the_setting_overrides_the_cadence(tmp_path, monkeypatch):
    monkeypatch.setenv("TPUWATCH_STALL_STACKS_S", "1.5")
    clock = Clock()
    agent = Agent(tmp_path, "r", clock=clock)
    watch = StallStacks(agent, StackDumper(agent))
    assert watch.fixed_s == 1.5
    steps(watch, clock, 3, every_s=1.0)  # too few intervals for a cadence: 60 s otherwise
    clock.t += 1.6
    assert len(taken_while_main_waits(watch)) == 1

"""Headless output: the progress line, the summary, and follow() over a growing recording."""

from __future__ import annotations

import io
import threading
import time

import pytest
from monitor_recordings import DATA, encode_all, mr

from tpuwatch import protocol
from tpuwatch.console import headless
from tpuwatch.monitor.monitor import Monitor
from tpuwatch.monitor.recording import read_all
from tpuwatch.monitor.state import RunState
from tpuwatch.protocol import Exit, Finding


def snap_of(name: str):
    messages, stats = read_all(DATA / name)
    monitor = Monitor(lambda: monitor.state.last_message_t or 0.0)
    s = monitor.state
    for m in messages:
        monitor.take(m)
    monitor.evaluate(s.last_message_t or 0.0, force=True)
    s.note_read_stats(malformed=stats.malformed, unknown=stats.unknown,
                      truncated_tail=stats.truncated_tail)
    return s.snapshot(s.last_message_t)


def test_progress_line_has_the_numbers():
    line = headless.progress_line(snap_of("healthy_4replica.jsonl"))
    assert "\n" not in line
    for part in ("step 300/300 (100%)", "steps/s", "p50 49.9 ms", "input 2.0%", "(4 replicas)",
                 "retraces 1", "dev 332 MiB", "host 2.00 GiB", "[finished]"):
        assert part in line, (part, line)
    running = headless.progress_line(snap_of("running_truncated.jsonl"))
    assert "step 200/600 (33%)" in running and "ETA 20s" in running and "[" not in running


def test_progress_line_flags_non_finite_replica():
    line = headless.progress_line(snap_of("crashed.jsonl"))
    assert "NON-FINITE on replica 2" in line and "[crashed]" in line


def test_summary_of_crashed_and_truncated_runs():
    text = headless.summary(snap_of("crashed.jsonl"))
    assert text.startswith("tpuwatch: train.py crashed (exit 1) after 10s")
    assert "FloatingPointError: loss is nan at step 150" in text
    assert "device peak 450 MiB" in text and "host RSS peak 2.00 GiB" in text
    text = headless.summary(snap_of("running_truncated.jsonl"))
    assert "truncated tail" in text


class FakeTime:
    def __init__(self) -> None:
        self.t = mr.T0

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_follow_prints_progress_every_interval_and_the_summary(tmp_path):
    """Deterministic: each is_alive() call appends the next chunk and one fake second passes."""
    msgs = mr.input_bound_messages(300)
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"")
    ft = FakeTime()
    chunks = [msgs[i:i + 25] for i in range(0, len(msgs), 25)]

    def is_alive() -> bool:
        if not chunks:
            return False
        with open(path, "ab") as f:
            f.write(encode_all(chunks.pop(0)))
        ft.t += 1.0
        return True

    out = io.StringIO()
    snap = headless.follow(path, is_alive, out=out, every_s=5.0, clock=ft.clock,
                           sleep=ft.sleep, poll_s=0.0)
    lines = out.getvalue().splitlines()
    progress = [ln for ln in lines if ln.startswith("step ")]
    n_chunks = -(-len(msgs) // 25)
    assert n_chunks // 5 - 1 <= len(progress) <= n_chunks // 5 + 1
    assert snap.status == "finished" and snap.step == 300
    findings = [ln for ln in lines if ln.startswith("[warning] input-bound")]
    assert len(findings) == 1  # printed once, when it first appeared
    assert lines.index(findings[0]) < len(lines) - 8  # ... during the run, not only at the end
    assert any(ln.startswith("tpuwatch: train.py finished (exit 0)") for ln in lines)
    assert any(ln.startswith("  finding   [warning] input-bound") for ln in lines)


def test_follow_a_real_writer_thread(tmp_path):
    msgs = mr.healthy_messages(120)
    path = tmp_path / "events.jsonl"
    done = threading.Event()

    def writer() -> None:
        with open(path, "ab") as f:
            for i, m in enumerate(msgs):
                line = protocol.encode(m)
                f.write(line[:10])  # torn writes: the reader must hold partial lines back
                f.flush()
                f.write(line[10:])
                if i % 40 == 0:
                    f.flush()
                    time.sleep(0.02)
        done.set()

    th = threading.Thread(target=writer)
    th.start()
    out = io.StringIO()
    snap = headless.follow(path, lambda: not done.is_set(), out=out, every_s=0.01, poll_s=0.005)
    th.join()
    assert snap.status == "finished" and snap.step == 120 and snap.malformed == 0
    assert not snap.truncated_tail
    assert "train.py finished (exit 0)" in out.getvalue()


def test_follow_calls_on_end_which_writes_the_exit_record(tmp_path):
    msgs = [m for m in mr.healthy_messages(30) if not isinstance(m, Exit)]
    path = tmp_path / "events.jsonl"
    path.write_bytes(encode_all(msgs))
    calls = []

    def on_end() -> None:  # what the launcher's finish() does when the agent was killed
        calls.append(1)
        with open(path, "ab") as f:
            f.write(protocol.encode(Exit(t=msgs[-1].t + 1, exit_code=137, signal=9,
                                         source="launcher", reason="killed by SIGKILL")))

    out = io.StringIO()
    snap = headless.follow(path, lambda: False, out=out, on_end=on_end)
    assert calls == [1]
    assert snap.status == "crashed" and snap.exit_code == 137 and snap.exit_signal == 9
    assert "crashed (exit 137)" in out.getvalue()


def test_follow_reports_lost_and_truncated_without_exit(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes((DATA / "running_truncated.jsonl").read_bytes())
    out = io.StringIO()
    snap = headless.follow(path, lambda: False, out=out, exit_grace_s=0.2, poll_s=0.02)
    assert snap.status == "lost" and snap.truncated_tail
    assert "lost: the process ended without an exit record" in out.getvalue()


def test_recorded_finding_is_printed_once(tmp_path):
    f = Finding(t=mr.T0 + 1, rule="custom-rule", severity="warning", message="custom thing",
                advice="do x")
    msgs = [mr.hello(), f, f, Exit(t=mr.T0 + 2, exit_code=0)]
    path = tmp_path / "events.jsonl"
    path.write_bytes(encode_all(msgs))
    out = io.StringIO()
    snap = headless.follow(path, lambda: False, out=out)
    assert out.getvalue().count("[warning] custom-rule: custom thing") == 1 + 1  # line + summary
    assert [x.rule for x in snap.findings] == ["custom-rule"]


def test_follow_prints_no_line_while_nothing_moves(tmp_path):
    """After the script's last step (TensorFlow tearing down, the process still alive)
    the same progress line was printed every few seconds. One line per change, then silence."""
    msgs = mr.input_bound_messages(50)
    exit_msgs = [m for m in msgs if m.kind == "exit"]
    body = [m for m in msgs if m.kind != "exit"]
    path = tmp_path / "events.jsonl"
    path.write_bytes(encode_all(body))
    ft = FakeTime()
    polls = iter(range(60))  # 60 fake seconds alive with nothing new, then the exit record

    def is_alive() -> bool:
        ft.t += 1.0
        if next(polls, None) is None:
            with open(path, "ab") as f:
                f.write(encode_all(exit_msgs))
            return False
        return True

    out = io.StringIO()
    headless.follow(path, is_alive, out=out, every_s=5.0, clock=ft.clock, sleep=ft.sleep, poll_s=0.0)
    progress = [ln for ln in out.getvalue().splitlines() if ln.startswith("step ")]
    assert len(progress) <= 2, progress  # the step line once (its status may change once)


def test_a_loss_from_an_earlier_step_is_never_shown_as_current():
    """A loop whose loss the agent could not see showed the previous phase's last loss,
    frozen, as every replica's current value. The loss carries its step."""
    s = RunState()
    s.apply(mr.hello())
    s.apply(mr.topology(mr.T0))
    s.apply(protocol.Step(step=10, t=mr.T0 + 1, step_time_s=0.1, input_wait_s=None, loss=2.5,
                          replica_losses=(2.4, 2.5, 2.6, 2.5)))
    for i in range(11, 136):
        s.apply(protocol.Step(step=i, t=mr.T0 + 1 + i * 0.01, step_time_s=0.01, input_wait_s=None, loss=None))
    snap = s.snapshot(mr.T0 + 3)
    assert snap.step == 135 and snap.loss_step == 10
    assert "loss 2.4..2.6 (4 replicas) at step 10, none since" in headless.progress_line(snap)


def test_the_last_steps_losses_read_after_it_make_it_current():
    """The tryout's custom loop: 150 steps ran, losses were sampled every 10 ms, so step 150's
    record went without them and the summary said "mean of the last step" of step 149's. Read
    when training paused (StepLoss), they belong to step 150, and every line names its step."""
    s = RunState()
    s.apply(mr.hello())
    s.apply(mr.topology(mr.T0))
    s.apply(protocol.Step(step=149, t=mr.T0 + 1, step_time_s=0.01, input_wait_s=None, loss=0.2,
                          replica_losses=(0.1, 0.2, 0.3, 0.2)))
    s.apply(protocol.Step(step=150, t=mr.T0 + 1.01, step_time_s=0.01, input_wait_s=None, loss=None))
    snap = s.snapshot(mr.T0 + 2)
    assert snap.loss_step == 149 and "at step 149, none since" in headless.progress_line(snap)
    s.apply(protocol.StepLoss(t=mr.T0 + 1.02, step=150, loss=0.25, replica_losses=(0.15, 0.25, 0.35, 0.25)))
    snap = s.snapshot(mr.T0 + 2)
    assert snap.loss_step == 150 and snap.loss == pytest.approx(0.25)
    assert "none since" not in headless.progress_line(snap)
    # A late read for an older step never replaces a newer loss.
    s.apply(protocol.StepLoss(t=mr.T0 + 1.03, step=149, loss=9.0, replica_losses=(9.0, 9.0, 9.0, 9.0)))
    assert s.snapshot(mr.T0 + 2).loss == pytest.approx(0.25)


def test_space_that_returns_just_before_the_end_is_said(tmp_path, monkeypatch):
    """CI: the script freed the disk and ended within the viewer's one-second disk check, so
    "is full" was the last word on the disk. The end checks once more."""
    disk = iter(["the disk holding x is full: ...", ""])
    monkeypatch.setattr(headless, "full_note", lambda path: next(disk, ""))
    path = tmp_path / "events.jsonl"
    path.write_bytes(encode_all(mr.healthy_messages(10)))
    alive = iter([True])
    out = io.StringIO()
    ft = FakeTime()
    headless.follow(path, lambda: next(alive, False), out=out, clock=ft.clock, sleep=ft.sleep, poll_s=0.0)
    lines = out.getvalue().splitlines()
    assert "tpuwatch: the disk holding x is full: ..." in lines
    assert "tpuwatch: the disk has space again" in lines, lines


def test_the_end_of_run_summary_gives_the_reports_whole_run_step_figures(tmp_path):
    # a new user's tryout (2026-11-26): `tpuwatch run --headless` ended with "step p50 4.31 ms
    # p95 5.2 ms, 151 steps/s" (the last 200 records, the last 30 s) and `tpuwatch report` said
    # "p50 4.4 ms, p95 5.42 ms" (every record) for the same finished run
    import re

    from monitor_recordings import write_run

    from tpuwatch.console import report

    msgs = [mr.hello(mr.T0), mr.topology(mr.T0)]
    slow = list(mr.steps(300, t0=mr.T0 + 1, step_time_s=0.006))  # a slower first half
    msgs += slow
    msgs += list(mr.steps(300, t0=slow[-1].t + 0.01, step_time_s=0.004, first_step=301))
    msgs.append(Exit(t=msgs[-1].t + 0.2, exit_code=0))
    run_dir = write_run(tmp_path / "run", msgs)
    out = io.StringIO()
    headless.follow(run_dir / "events.jsonl", lambda: False, out=out)
    (row,) = [line for line in out.getvalue().splitlines() if line.startswith("  steps ")]
    rep = report.render_text(report.build_model(run_dir))
    p50, p95 = re.search(r"step time +p50 (\S+ \S+), p95 (\S+ \S+)", rep).groups()
    rate = re.search(r"speed +([\d.,]+) steps/s", rep).group(1)
    assert f"step p50 {p50}  p95 {p95}" in row and f"{rate} steps/s" in row, (row, rep)
    # the progress lines' steps/s is the last 10 s: the summary says its figures are the whole run's
    # (a tester read 0.764 steps/s on the last line and 0.275 in the summary, nothing saying why)
    assert f"{rate} steps/s over the whole run" in row, row


def test_a_script_that_exits_non_zero_without_an_exception_has_its_last_output_line_said(tmp_path):
    # a new user's tryout (2026-11-26): `tpuwatch run --headless fit.py --nope` said only "fit.py
    # crashed (exit 2) after 2.0s"; why (argparse's "error: unrecognized arguments") was in the
    # script's output alone
    from monitor_recordings import write_run

    msgs = [mr.hello(mr.T0), Exit(t=mr.T0 + 2.0, exit_code=2)]
    run_dir = write_run(tmp_path / "run", msgs)
    (run_dir / "output.log").write_text("usage: fit.py [-h] [--epochs EPOCHS]\n"
                                        "fit.py: error: unrecognized arguments: --nope\n\n")
    out = io.StringIO()
    headless.follow(run_dir / "events.jsonl", lambda: False, out=out)
    text = out.getvalue()
    assert "crashed (exit 2)" in text
    assert "  output    fit.py: error: unrecognized arguments: --nope (the script's last line)" in text, text

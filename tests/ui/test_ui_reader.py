"""The dashboard reads off the UI thread, and a worker's failure surfaces in one place: the
reader thread drains the source, applies, evaluates and tails output.log; the UI thread only
takes frames. Real Textual apps (Pilot), real files."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from textual.worker import WorkerFailed
from ui_support import FakeClock, last_t, make_live_run, recording, screen_text, sync

from tpuwatch import rundir
from tpuwatch.protocol import Command, Finding
from tpuwatch.sources.file_source import FileSource
from tpuwatch.sources.replay_source import ReplaySource
from tpuwatch.ui.app import TpuwatchApp


class ThreadNotingSource(FileSource):
    """A FileSource that notes which thread reads it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.readers: set[str] = set()

    def poll_tagged(self):
        self.readers.add(threading.current_thread().name)
        return super().poll_tagged()


async def _until(predicate, timeout_s: float = 30.0) -> None:
    """Waits (bounded) for the reader thread; never a timing assert, only a bound on the wait."""
    for _ in range(int(timeout_s / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the condition did not come true in time")


@sync
async def test_the_reader_thread_reads_and_the_snapshot_is_the_one_the_ui_thread_would_build(tmp_path) -> None:
    run = make_live_run(tmp_path, "healthy_4replica", upto=250, output="epoch 1/3\nloss 0.4\n")
    clock = FakeClock(last_t(recording("healthy_4replica")[:250]) + 0.5)
    ui = threading.current_thread().name

    inline_source = ThreadNotingSource(run, send=lambda c: None)
    inline = TpuwatchApp(inline_source, run_dir=run, clock=clock, refresh_hz=0)
    async with inline.run_test(size=(160, 48)):
        inline.pull()
        want = inline.snapshot
    assert want.step > 100
    assert inline_source.readers == {ui}  # refresh_hz=0: the test's own pulls read on its thread

    threaded_source = ThreadNotingSource(run, send=lambda c: None)
    threaded = TpuwatchApp(threaded_source, run_dir=run, clock=clock, refresh_hz=20)
    async with threaded.run_test(size=(160, 48)):
        await _until(lambda: threaded.snapshot == want)
        # Lines of output.log came through the reader's frames too.
        await _until(lambda: "loss 0.4" in screen_text(threaded))
    assert threaded_source.readers and ui not in threaded_source.readers, threaded_source.readers


@sync
async def test_replay_keys_move_the_cursor_on_the_reader_thread() -> None:
    moved_by: set[str] = set()

    class NotingReplay(ReplaySource):
        def seek(self, delta_s: float) -> None:
            moved_by.add(threading.current_thread().name)
            super().seek(delta_s)

    clock = FakeClock(100.0)
    source = NotingReplay(recording("healthy_4replica"), clock=clock, paused=True)
    app = TpuwatchApp(source, refresh_hz=20)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("end")
        await _until(lambda: app.snapshot.step == 300)
        await pilot.press("left")  # back: the reader starts its state over and reads up to the cursor
        await _until(lambda: 0 < app.snapshot.step < 300)
        assert source.generation == 1
    assert moved_by and threading.current_thread().name not in moved_by


@sync
async def test_a_failing_worker_is_said_once_in_a_toast_and_the_events_panel(live_app, tmp_path) -> None:
    """Workers run with exit_on_error=False; before, their errors vanished."""
    run = make_live_run(tmp_path, "healthy_4replica", upto=200)

    def broken_send(command: Command) -> None:
        raise RuntimeError("the control socket said something odd")

    app = TpuwatchApp(FileSource(run, send=broken_send), run_dir=run,
                      clock=FakeClock(last_t(recording("healthy_4replica")[:200]) + 0.5), refresh_hz=0)
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(2):  # the same failure twice: said once
            with pytest.raises(WorkerFailed):
                await app._deliver(Command(id="checkpoint-1", action="checkpoint")).wait()
            await pilot.pause()
        toasts = [n.message for n in app._notifications if "odd" in n.message]
        assert toasts == ["sending a command failed: RuntimeError: the control socket said something odd"], toasts
        lines = [e for e in app.snapshot.events if "odd" in e.message]
        assert len(lines) == 1 and lines[0].level == "error" and lines[0].source == "viewer", lines


@sync
async def test_a_reader_that_fails_is_said_and_reading_goes_on(tmp_path) -> None:
    run = make_live_run(tmp_path, "healthy_4replica", upto=200)

    class FailsOnce(FileSource):
        failed = False

        def poll_tagged(self):
            if not self.failed and threading.current_thread() is not threading.main_thread():
                FailsOnce.failed = True
                raise ValueError("an undecodable surprise")
            return super().poll_tagged()

    app = TpuwatchApp(FailsOnce(run), run_dir=run,
                      clock=FakeClock(last_t(recording("healthy_4replica")[:200]) + 0.5), refresh_hz=20)
    async with app.run_test(size=(120, 40)):
        await _until(lambda: any("undecodable" in e.message for e in app.snapshot.events))
        toasts = [n.message for n in app._notifications if "undecodable" in n.message]
        assert toasts == ["reading the run failed: ValueError: an undecodable surprise"], toasts
        # The UI thread reads on at the refresh rate: new steps still arrive.
        before = app.snapshot.step
        lines = (Path(__file__).resolve().parent.parent / "data" / "healthy_4replica.jsonl").read_bytes().splitlines(True)
        with open(run / rundir.EVENTS, "ab") as f:
            f.write(b"".join(lines[200:230]))
        await _until(lambda: app.snapshot.step > before)


@sync
async def test_findings_this_viewer_records_are_not_applied_again_when_it_reads_them_back(tmp_path) -> None:
    """Contracts: the run's owner puts its findings into its state directly;
    the copy it appends to events.jsonl is for the recording's other readers. Read back, a
    recorded finding used to go into the state again: a later verdict on the same finding was
    replaced by the stale recorded one and logged a second time."""
    run = make_live_run(tmp_path, "input_bound")
    clock = FakeClock(last_t(recording("input_bound")) + 0.5)
    app = TpuwatchApp(FileSource(run), run_dir=run, clock=clock, refresh_hz=0, record_findings=True)
    async with app.run_test(size=(120, 40)):  # its first read: the whole recording, one finding
        (found,) = app.snapshot.findings
        recorded = [line for line in (run / rundir.EVENTS).read_text().splitlines() if '"finding"' in line]
        assert len(recorded) == 1  # recorded for the others
        # The engine's next verdict on the same finding, before the recorded copy is read back.
        worse = "critical" if found.severity != "critical" else "warning"
        later = Finding(t=found.t + 1, rule=found.rule, severity=worse, message=found.message,
                        advice=found.advice, evidence=found.evidence, worker=found.worker)
        app._state.add_finding(later, found.worker)
        app.pull()
        app.pull()
        assert app.snapshot.findings == (later,)
        logged = [e for e in app.snapshot.events if e.source == f"diagnostics:{found.rule}"]
        assert len(logged) == 2, logged  # found, then the later verdict: the read-back adds none

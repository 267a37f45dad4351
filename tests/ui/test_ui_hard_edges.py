"""The dashboard against hostile or heavy output from the run: markup-looking text,
terminal escapes, and an Output panel fed faster than it can hold."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ui_support import DATA, FakeClock, screen_text, sync, until_shown

from tpuwatch import protocol, rundir
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.protocol import Event, ExceptionRaised, Exit, Finding, HostSample, Result, Step
from tpuwatch.sources.file_source import FileSource
from tpuwatch.ui.app import TpuwatchApp
from tpuwatch.ui.output_tail import clean_line
from tpuwatch.ui.widgets.output_log import MAX_LINES, OutputLog
from tpuwatch.ui.widgets.run_header import header_text

sys.path.insert(0, str(DATA))
import make_recordings as mr  # noqa: E402


@sync
async def test_output_panel_follows_a_burst_past_its_line_cap(live_app) -> None:
    # ~10k lines a second for 5 s, read at the dashboard's refresh rate (4 reads a second):
    # once the panel holds MAX_LINES, each new batch drops as many old lines as it adds.
    app = live_app(upto=100, output="")
    run = app.run_dir
    n = 0
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.pause()
        for _ in range(20):
            with open(run / "output.log", "a") as f:
                f.write("".join(f"line {n + i:06d} of the burst\n" for i in range(2_500)))
            n += 2_500
            app.pull()
            await pilot.pause()
        assert n > 2 * MAX_LINES
        last = f"line {n - 1:06d} of the burst"
        assert app.query_one(OutputLog).lines[-1] == last
        shown = screen_text(app)
        assert last in shown, shown
        assert f"line {n - 2:06d} of the burst" in shown


@sync
async def test_markup_in_command_results_is_shown_literally(live_app, sent) -> None:
    # `tpuwatch checkpoint RUN --dir '/etc/x[/]y'` from another shell killed every open
    # dashboard (MarkupError), and `[lr=0.1]` vanished from toasts.
    app = live_app(upto=150)
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        await pilot.pause()
        await pilot.press("c")
        await app.workers.wait_for_complete()
        cid = sent[0].id
        t = app.snapshot.now
        app._state.apply(Result(t=t, id=cid, action="checkpoint", ok=False,
                                message="cannot write /etc/x[/]y: permission denied"))
        app._state.apply(Result(t=t, id="profile-other", action="profile", ok=True, message="profile saved",
                                details={"path": "/data/run[lr=0.1]/[b]prof[/b]"}))
        app.pull()
        shown = await until_shown(pilot, app, "cannot write /etc/x[/]y: permission denied",
                                  "/data/run[lr=0.1]/[b]prof[/b]")
        assert app.is_running
        assert "cannot write /etc/x[/]y: permission denied" in shown, shown
        assert "/data/run[lr=0.1]/[b]prof[/b]" in shown, shown
        toasts = [toast.render().plain for toast in app.screen.query("Toast")]
        assert "checkpoint failed: cannot write /etc/x[/]y: permission denied" in toasts
        assert "profile done: /data/run[lr=0.1]/[b]prof[/b]  (r: all results)" in toasts


@sync
async def test_markup_in_a_stack_dump_note_is_shown_literally(live_app, sent) -> None:
    app = live_app(upto=150)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        await pilot.press("s")
        await app.workers.wait_for_complete()
        cid = sent[0].id
        app._state.apply(Result(t=app.snapshot.now, id=cid, action="stack_dump", ok=False,
                                message="cannot write [/]stacks[lr=0.1]"))
        app.pull()
        shown = await until_shown(pilot, app, "cannot write [/]stacks[lr=0.1]")
        assert app.is_running
        assert "cannot write [/]stacks[lr=0.1]" in shown


@sync
async def test_markup_in_an_output_search_term_is_shown_literally(live_app) -> None:
    app = live_app(upto=100, output="a [/] b\n[lr=0.1]\n")
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.pause()
        await pilot.press("slash")
        for key in "[/]":
            await pilot.press(key)
        await pilot.press("enter")
        await pilot.pause()
        assert app.is_running
        assert "/[/]: 1/1 (n/N)" in screen_text(app)


#: OSC 52 (clipboard), OSC 0 (title), ESC c (reset), ESC 7/8, 8-bit CSI and OSC, DEL.
HOSTILE = "\x1b]52;c;cHduZWQ=\x07\x1b]0;pwned\x07\x1bc\x1b7\x1b8\x9b2J\x9d0;t\x9c\x7f"
CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def hostile_run(tmp_path: Path) -> Path:
    """A crashed run whose script name, host, events, exception, finding and output carry
    terminal controls."""
    msgs = mr.crashed_messages(60, nan_at=50)
    msgs[0] = mr.hello(script=f"tr{HOSTILE}ain.py", host=f"h{HOSTILE}")
    at = next(i for i, m in enumerate(msgs) if isinstance(m, ExceptionRaised))
    t = msgs[at].t
    msgs[at:at + 1] = [
        Event(t=t, level="warning", source="agent", message=f"event {HOSTILE}"),
        ExceptionRaised(t=t, type="ValueError", message=f"bad {HOSTILE}",
                        traceback=f"Traceback (most recent call last):\nValueError: bad {HOSTILE}\n"),
        Finding(t=t, rule="custom", severity="warning", message=f"finding {HOSTILE}", advice=f"advice {HOSTILE}"),
    ]
    run = tmp_path / "run"
    rundir.create(run)
    mr.write(run / rundir.EVENTS, msgs)
    (run / rundir.OUTPUT).write_text(f"out {HOSTILE}\n\x1b[32mgreen\x1b[0m\n")
    return run


@sync
async def test_terminal_controls_from_the_run_are_shown_escaped(tmp_path) -> None:
    run = hostile_run(tmp_path)
    app = TpuwatchApp(FileSource(run), run_dir=run, refresh_hz=0)
    async with app.run_test(size=(200, 90), notifications=True) as pilot:
        await pilot.pause()
        app.pull()
        await pilot.pause()
        app.notify(f"toast {HOSTILE}")
        await pilot.pause(0.2)
        shown = screen_text(app)
        assert not CONTROLS.findall(shown), CONTROLS.findall(shown)
        # (Textual drops BEL from text it is given before we see it; nothing else.)
        for text in ("tr\\x1b]52;c;cHduZWQ=", "\\x1bc\\x1b7\\x1b8\\x9b2J\\x9d0;t\\x9c\\x7fain.py",
                     # the finding and the exception wrap in their panels: the escaped text on its own
                     "finding", "ValueError: bad", "\\x1b]52;c;cHduZWQ=\\x1b]0;pwned\\x1bc",
                     "event \\x1b]52;c;", "out \\x1b]52;c;cHduZWQ=\\x07\\x1b]0;pwned\\x07\\x1bc\\x1b7\\x1b8\\x9b2J"):
            assert text in shown, (text, shown)
        assert "green" in shown and "\\x1b[32m" not in shown  # colour codes are dropped, as before
        toasts = [toast.render().plain for toast in app.screen.query("Toast")]
        assert toasts and all(not CONTROLS.findall(t) for t in toasts), toasts
        await pilot.press("r")  # the results screen
        await pilot.pause()
        assert not CONTROLS.findall(screen_text(app))


def test_output_lines_keep_colourless_text_and_escape_every_other_control() -> None:
    assert clean_line("\x1b[1;32mok\x1b[0m\tdone") == "ok\tdone"
    assert clean_line("a\x1bcb\x1b7c\x1b8") == "a\\x1bcb\\x1b7c\\x1b8"
    assert clean_line("\x1b]52;c;cHduZWQ=\x07x") == "\\x1b]52;c;cHduZWQ=\\x07x"
    assert clean_line("\x9b2J\x9d0;t\x9c\x7f") == "\\x9b2J\\x9d0;t\\x9c\\x7f"
    assert clean_line("10/10 [====]\x08\x08\r10/10 done") == "10/10 done"


def samples(t0: float, seconds: float) -> list[HostSample]:
    """The agent's sampler (2 Hz) for ``seconds`` after ``t0``: the process is alive."""
    return [HostSample(t=t0 + 0.5 * i, rss_bytes=1 << 30, available_bytes=8 << 30, total_bytes=16 << 30,
                       cpu_percent=3.0) for i in range(1, int(seconds * 2) + 1)]


def hung_app(tmp_path: Path, sampling_s: float, seen_after_s: float) -> tuple[TpuwatchApp, Path, FakeClock, float]:
    """A dashboard on a live run that hangs after step 150 of 300 while its agent samples for
    ``sampling_s``, its clock ``seen_after_s`` after that step: (app, run, clock, the step's time)."""
    msgs = [m for m in mr.healthy_messages(300) if not isinstance(m, Exit)]
    last_t = next(m.t for m in msgs if isinstance(m, Step) and m.step == 150)
    msgs = [m for m in msgs if getattr(m, "t", 0.0) <= last_t] + samples(last_t, sampling_s)
    run = tmp_path / "run"
    rundir.create(run)
    mr.write(run / rundir.EVENTS, msgs)
    (run / rundir.OUTPUT).write_text("")
    clock = FakeClock(last_t + seen_after_s)
    return TpuwatchApp(FileSource(run), run_dir=run, clock=clock, refresh_hz=0), run, clock, last_t


async def first_frame(app: TpuwatchApp, pilot) -> str:
    """The screen after the app's first read."""
    await pilot.pause()
    app.pull()
    await pilot.pause()
    return screen_text(app)


@sync
async def test_the_stalled_badge_and_the_findings_panel_agree_during_a_hang(tmp_path) -> None:
    app, run, clock, last_t = hung_app(tmp_path, sampling_s=30, seen_after_s=30)
    async with app.run_test(size=(160, 50)) as pilot:
        shown = await first_frame(app, pilot)
        assert "RUNNING" in shown and "stall:" not in shown
        assert "20.0 steps/s" in shown
        # Past the stall limit (60 s), the agent still sampling: the badge and the finding at once.
        with open(run / rundir.EVENTS, "ab") as f:
            f.write(b"".join(protocol.encode(m) for m in samples(last_t + 30, 60)))
        clock.t = last_t + 90
        app.pull()
        await pilot.pause()
        shown = screen_text(app)
        assert "STALLED 1:30" in shown
        assert "stall: no step for 90 s after step 150" in shown, shown
        assert "0 steps/s" in shown and "20.0 steps/s" not in shown


@sync
async def test_a_silent_process_is_stalled_and_the_findings_panel_says_why(tmp_path) -> None:
    app, _, _, _ = hung_app(tmp_path, sampling_s=5, seen_after_s=600)
    async with app.run_test(size=(160, 50)) as pilot:
        shown = await first_frame(app, pilot)
        assert "STALLED 10:00" in shown
        assert "silent: nothing from the training process for" in shown and "9:55" in shown, shown


def test_a_newline_in_the_script_name_keeps_the_header_on_two_lines() -> None:
    s = RunSnapshot(status="running", script="tr\nain\x1b[2J.py", host="h\r1", step=5, started_t=0.0, now=10.0)
    text = header_text(s, 80).plain
    line1, line2 = text.split("\n")
    assert line1.startswith("tr\\nain\\x1b[2J.py · h\\r1") and line1.rstrip().endswith("RUNNING")
    assert len(line1) == 80 and line2.startswith("step 5")


@sync
async def test_during_a_stall_the_stacks_key_opens_the_stacks_the_agent_took_when_it_began(live_app, sent) -> None:
    from tpuwatch.protocol import StackDump

    app = live_app(upto=150)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        t = app.snapshot.now
        path = str(app.run_dir / "stacks" / "20261128-011256-stall-after-step-150.txt")
        app._state.apply(StackDump(t=t, text='Thread "MainThread" [TRAINING THREAD]\n  File "train.py", line 26\n'
                                   "    time.sleep(40)\n", path=path, reason="stall", step=150, gap_s=11.0,
                                   headline="waiting at train.py:26: time.sleep(40)", stalled_in="script"))
        app._state.apply(Finding(t=t, rule="stall", severity="warning",
                                 message="stall: no step for 61 s after step 150; the training thread was waiting "
                                         "at train.py:26: time.sleep(40)", advice="Fix or bound that wait",
                                 evidence={"ongoing": 1, "stacks": path, "last_step": 150}))
        app.pull()
        await until_shown(pilot, app, "s: the stacks taken when it stalled")
        await pilot.press("s")
        shown = await until_shown(pilot, app, "time.sleep(40)", "11 s into the stall after step 150")
        assert "time.sleep(40)" in shown and path in shown, shown
        assert not [c for c in sent if c.action == "stack_dump"]  # nothing asked of the agent

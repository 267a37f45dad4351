"""The dashboard against hostile or heavy output from the run (issue 26): markup-looking text,
terminal escapes, and an Output panel fed faster than it can hold."""

from __future__ import annotations

from ui_support import screen_text, sync

from tpuwatch.protocol import Result
from tpuwatch.ui.widgets.output_log import MAX_LINES, OutputLog


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
        await pilot.pause()
        await pilot.pause(0.2)
        assert app.is_running
        shown = screen_text(app)
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
        await pilot.pause(0.6)
        assert app.is_running
        assert "cannot write [/]stacks[lr=0.1]" in screen_text(app)


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

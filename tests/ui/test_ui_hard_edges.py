"""The dashboard against hostile or heavy output from the run (issue 26): markup-looking text,
terminal escapes, and an Output panel fed faster than it can hold."""

from __future__ import annotations

from ui_support import screen_text, sync

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

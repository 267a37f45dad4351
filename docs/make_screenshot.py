"""Regenerates docs/dashboard.svg, the README's picture of the live dashboard, as Textual draws it.

The dashboard is built on a recorded run of a bundled sample, ``sample_runs/planted/retrace_storm.py``
(a custom training loop on 4 replicas whose step is traced again at every call), kept in
``sample_runs/recorded/retrace_storm/`` and cut at its last step: the ``retrace-storm`` finding
with the script's line, and the Goodput panel booking the time those traces took. A fixed clock
and no refresh timer make the picture the same on every machine; it changes only when the
dashboard does (tests/ui/test_readme_screenshot.py checks that the committed one matches a
regeneration).

    python docs/make_screenshot.py            # writes docs/dashboard.svg
    python docs/make_screenshot.py OUT.svg    # elsewhere

The recording itself was made with
    tpuwatch run --headless --run-dir sample_runs/recorded/retrace_storm sample_runs/planted/retrace_storm.py
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "sample_runs" / "recorded" / "retrace_storm"
#: 120 columns: every panel, the Goodput one with them, and text that still reads at the width of
#: GitHub's README column.
SIZE = (120, 36)


def _through_last_step(data: bytes) -> bytes:
    """The recording up to its last step record: the run still training, as a user watches it."""
    at = data.rfind(b'\n{"kind":"step",')
    return data[:data.index(b"\n", at + 1) + 1]


def render() -> str:
    """The SVG text of the dashboard on the recording through its last step."""
    sys.path.insert(0, str(ROOT))
    from tpuwatch import rundir
    from tpuwatch.monitor.recording import read_all
    from tpuwatch.sources.file_source import FileSource
    from tpuwatch.ui.app import TpuwatchApp

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "20261128-015700-retrace_storm-5c1e"
        rundir.create(run)
        (run / rundir.EVENTS).write_bytes(_through_last_step((RUN / rundir.EVENTS).read_bytes()))
        (run / rundir.OUTPUT).write_bytes((RUN / rundir.OUTPUT).read_bytes())
        messages, _ = read_all(run / rundir.EVENTS)
        now = max(m.t for m in messages if hasattr(m, "t")) + 0.5
        app = TpuwatchApp(FileSource(run, send=lambda command: None), run_dir=run, clock=lambda: now, refresh_hz=0)

        async def shoot() -> str:
            async with app.run_test(size=SIZE) as pilot:
                await pilot.pause()
                for _ in range(100):  # a loaded machine can cut a read short: read the whole recording
                    if not app.snapshot.catching_up:
                        break
                    app.pull()
                    await pilot.pause()
                return app.export_screenshot(title="tpuwatch run sample_runs/planted/retrace_storm.py")

        return asyncio.run(shoot())


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "docs" / "dashboard.svg"
    out.write_text(render())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

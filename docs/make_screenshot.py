"""Regenerates docs/dashboard.svg, the README's picture of the live dashboard, as Textual draws it.

The dashboard is built on a recorded run (tests/data/healthy_4replica.jsonl, its first 300 lines:
a Keras fit on 4 replicas mid-run) with a fixed clock and no refresh timer, so the picture is the
same on every machine and changes only when the dashboard does (tests/ui/test_readme_screenshot.py
checks that the committed one matches a regeneration).

    python docs/make_screenshot.py            # writes docs/dashboard.svg
    python docs/make_screenshot.py OUT.svg    # elsewhere
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDING = ROOT / "tests" / "data" / "healthy_4replica.jsonl"
LINES = 300
SIZE = (100, 32)
OUTPUT = (
    "Using MirroredStrategy with devices ('/CPU:0', '/CPU:1', '/CPU:2', '/CPU:3')\n"
    "Epoch 1/3\n"
    "100/100 - 5s - 50ms/step - loss: 1.2871\n"
    "Epoch 2/3\n"
)


def render() -> str:
    """The SVG text of the dashboard on the recording's first ``LINES`` lines."""
    sys.path.insert(0, str(ROOT))
    from tpuwatch import rundir
    from tpuwatch.monitor.recording import read_all
    from tpuwatch.sources.file_source import FileSource
    from tpuwatch.ui.app import TpuwatchApp

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "20250615-120000-keras_fit-3f2a"
        rundir.create(run)
        lines = RECORDING.read_bytes().splitlines(keepends=True)[:LINES]
        (run / rundir.EVENTS).write_bytes(b"".join(lines))
        (run / rundir.OUTPUT).write_text(OUTPUT)
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
                return app.export_screenshot(title="tpuwatch run sample_runs/keras_fit.py")

        return asyncio.run(shoot())


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "docs" / "dashboard.svg"
    out.write_text(render())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What ``tpuwatch ls`` prints: one line per run, newest first, under a header."""

from __future__ import annotations

import time
from typing import Sequence

from tpuwatch.monitor.runs import RunInfo


def render_run_list(runs: Sequence[RunInfo]) -> str:
    """The table of runs (state, start in local time, last step, exit code, script)."""
    lines = [f"{'RUN':<40} {'STATE':<9} {'STARTED':<19} {'STEPS':>8} {'EXIT':>4}  SCRIPT"]
    for r in runs:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.start)) if r.start else "?"
        steps = "" if r.steps is None else str(r.steps)
        code = "" if r.exit_code is None else str(r.exit_code)
        lines.append(f"{r.id:<40} {r.state:<9} {started:<19} {steps:>8} {code:>4}  {r.script}")
    return "\n".join(lines)

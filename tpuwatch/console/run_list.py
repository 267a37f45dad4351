"""What ``tpuwatch ls`` prints: one line per run, newest first, under a header."""

from __future__ import annotations

import time
from typing import Sequence

from tpuwatch.monitor.runs import RunInfo
from tpuwatch.printable import one_line


def render_run_list(runs: Sequence[RunInfo], width: int | None = None) -> str:
    """The table of runs (state, start in local time, last step, exit code, script), within
    ``width`` columns (None: no limit)."""
    # The id and the script come from the run's files: a newline or a terminal control in
    # them would break the table or reach the terminal, so each cell is one escaped line.
    rows = [{"RUN": one_line(r.id), "STATE": r.state,
             "STARTED": _local_time(r.start),
             "STEPS": "" if r.steps is None else str(r.steps),
             "EXIT": "" if r.exit_code is None else str(r.exit_code), "SCRIPT": one_line(r.script)} for r in runs]
    return "\n".join(_lines(rows, width))


def _local_time(t: float | None) -> str:
    """``t`` in local time; "?" when unknown or no date (a crafted run.json's 1e300 or NaN)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "?"
    except (OverflowError, OSError, ValueError):
        return "?"


#: What `tpuwatch ls` gives up, in order, to fit the terminal: (columns shown, narrowest script
#: column). The start time goes first (the run id begins with it); the id, which every other
#: command takes, is never cut.
_LAYOUTS = (
    (("RUN", "STATE", "STARTED", "STEPS", "EXIT", "SCRIPT"), 24),
    (("RUN", "STATE", "STEPS", "EXIT", "SCRIPT"), 12),
    (("RUN", "STATE", "STEPS", "EXIT"), 0),
    (("RUN", "STATE", "EXIT"), 0),
    (("RUN", "STATE"), 0),
)


def _lines(rows: list[dict[str, str]], width: int | None) -> list[str]:
    """The header and one line per run, within ``width`` columns (None: no limit), cutting the
    script's path from the left ("…/train.py") before dropping whole columns."""
    right = {"STEPS", "EXIT"}
    widths = {c: max([len(c)] + [len(r[c]) for r in rows]) for c in _LAYOUTS[0][0]}
    for columns, narrowest in _LAYOUTS:
        fixed = [c for c in columns if c != "SCRIPT"]
        used = sum(widths[c] for c in fixed) + len(fixed) - 1
        room = widths["SCRIPT"] if width is None else width - used - 2
        if "SCRIPT" not in columns and (width is None or used <= width):
            break
        if "SCRIPT" in columns and room >= min(narrowest, widths["SCRIPT"]):
            break
    script_width = max(0, min(room, widths["SCRIPT"]))

    def line(cells: dict[str, str]) -> str:
        parts = [cells[c].rjust(widths[c]) if c in right else cells[c].ljust(widths[c]) for c in fixed]
        text = " ".join(parts)
        if "SCRIPT" in columns:
            script = cells["SCRIPT"]
            if len(script) > script_width:
                script = "…" + script[len(script) - script_width + 1:]
            text += "  " + script
        return text.rstrip()

    return [line({c: c for c in widths}), *(line(r) for r in rows)]

"""``tpuwatch compare RUN_A RUN_B [...]``: runs side by side, each against the first."""

from __future__ import annotations

import argparse

from tpuwatch import rundir
from tpuwatch.commands.lines import error


def add_parser(sub) -> argparse.ArgumentParser:
    compare = sub.add_parser(
        "compare", help="runs side by side, each against the first",
        description="Compare finished (or running) runs, each against the first: wall time, step time p50/p95, "
                    "steps/s, examples/s, input wait; the difference of the step-time medians with a 95% "
                    "confidence interval (moving-block bootstrap over steps, fixed seed; \"no significant "
                    "difference\" when it includes zero); the losses aligned by step in one chart; findings in "
                    "one run and not the other; differences in TF/Keras versions, strategy, replicas, batch size, "
                    "argv. What cannot be compared (a run without steps, different scripts or replica counts, a "
                    "crashed run) is said in one line.")
    compare.add_argument("runs", nargs="+", metavar="RUN", help="run ids or run directories (at least two)")
    compare.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    return compare


def main(ns: argparse.Namespace) -> int:
    from tpuwatch.console import compare, report

    if len(ns.runs) < 2:
        return error("compare needs at least two runs (run ids or run directories)")
    if len(ns.runs) > len(compare.MARKS):
        return error(f"compare takes at most {len(compare.MARKS)} runs, got {len(ns.runs)}")
    runs = []
    for i, ref in enumerate(ns.runs):
        label = chr(ord("A") + i)
        try:
            runs.append(compare.load(label, rundir.find_run(ref)))
        except (FileNotFoundError, report.ReportError) as e:
            return error(f"run {label} ({ref}): {e}")
    data = compare.compare(runs)
    render = {"json": compare.render_json, "markdown": compare.render_markdown}.get(ns.format, compare.render_text)
    print(render(data), end="" if ns.format != "json" else "\n")
    return 0

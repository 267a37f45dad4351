"""``tpuwatch compare RUN_A RUN_B [...]``: runs side by side, each against the first."""

from __future__ import annotations

import argparse
import sys

from tpuwatch import rundir
from tpuwatch.commands.lines import error


def add_parser(sub) -> argparse.ArgumentParser:
    compare = sub.add_parser(
        "compare", help="runs side by side, each against the first",
        description="Compare finished (or running) runs, each against the first: wall time, step time p50/p95, "
                    "steps/s, examples/s, input wait; the difference of the step-time medians with a 95% "
                    "confidence interval (moving-block bootstrap over steps, fixed seed; \"no significant "
                    "difference\" when it includes zero); host RSS and device memory peaks; the goodput ledger's "
                    "buckets; the losses aligned by step in one chart; findings in one run and not the other, "
                    "and findings that changed severity or size; differences in TF/Keras versions, strategy, "
                    "replicas, batch size, argv. What cannot be compared (a run without steps, different scripts or "
                    "replica counts, a crashed run) is said in one line.")
    compare.add_argument("runs", nargs="+", metavar="RUN", help="run ids or run directories (at least two)")
    compare.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    compare.add_argument("--max-regression", type=float, metavar="PCT",
                         help="a gate for CI, with exactly two runs (BASE NEW): exit 1 when NEW's step-time median "
                              "is slower than BASE's by more than PCT %% and the 95%% interval of the difference "
                              "lies wholly above PCT %%, else 0 (2 when a run has too few steps to judge); the last "
                              "line says which (on stderr with --format json, whose \"gate\" carries the verdict)")
    return compare


def main(ns: argparse.Namespace) -> int:
    from tpuwatch.console import compare, report

    if len(ns.runs) < 2:
        return error("compare needs at least two runs (run ids or run directories)")
    gate_pct = ns.max_regression
    if gate_pct is not None and (len(ns.runs) != 2 or not gate_pct >= 0 or gate_pct == float("inf")):
        return error("--max-regression takes exactly two runs (BASE NEW) and a percentage of 0 or more, "
                     f"got {len(ns.runs)} runs and {gate_pct:g}")
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
    verdict = compare.gate(data, gate_pct) if gate_pct is not None else None
    if verdict is not None:
        data["gate"] = verdict
    render = {"json": compare.render_json, "markdown": compare.render_markdown}.get(ns.format, compare.render_text)
    print(render(data), end="" if ns.format != "json" else "\n")
    if verdict is None:
        return 0
    print(verdict["text"], file=sys.stderr if ns.format == "json" else sys.stdout, flush=True)
    return int(verdict["exit_code"])

"""``tpuwatch report RUN``: a run's summary and findings, as text, markdown or JSON."""

from __future__ import annotations

import argparse

from tpuwatch import rundir
from tpuwatch.commands.lines import error


def add_parser(sub) -> argparse.ArgumentParser:
    report = sub.add_parser("report", help="summary and findings of a run")
    report.add_argument("run", nargs="?", help="run id or run directory (default: the latest run)")
    report.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    return report


def main(ns: argparse.Namespace) -> int:
    from tpuwatch.console import report

    try:
        run_dir = rundir.find_run(ns.run)
    except FileNotFoundError as e:
        return error(str(e))
    try:
        data = report.build_model(run_dir)
    except report.ReportError as e:
        return error(str(e))
    if ns.format == "json":
        print(report.render_json(data))
    elif ns.format == "markdown":
        print(report.render_markdown(data))
    else:
        print(report.render_text(data))
    return 0

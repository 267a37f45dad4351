"""``tpuwatch doctor``: check the environment you are about to train in."""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    doctor = sub.add_parser("doctor", help="check the environment you are about to train in")
    doctor.add_argument("--python", help="interpreter the training will use (default: this one)")
    doctor.add_argument("--gcs", metavar="gs://BUCKET[/PATH]", help="also check this GCS destination")
    return doctor


def main(ns: argparse.Namespace) -> int:
    from tpuwatch.console import doctor

    return doctor.main(python=ns.python, gcs=ns.gcs)

"""`pip install tpuwatch` never moves the protobuf the installed TensorFlow wants: nothing the base
install needs depends on protobuf, however deep (.ci/protobuf installs it beside
TF 2.16, 2.19, 2.20 and 2.21 and checks protobuf did not move)."""

from __future__ import annotations

import importlib.metadata as md
import re

import tomllib

from tpuwatch_testing import ROOT


def _name(requirement: str) -> str:
    return re.split(r"[\s;<>=!~\[(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _needs(dist: str, seen: set[str]) -> set[str]:
    """``dist`` and everything it requires in this environment (extras and markers that do not
    apply are left out, as pip leaves them out)."""
    if dist in seen:
        return seen
    seen.add(dist)
    for req in md.requires(dist) or []:
        if "extra ==" in req:
            continue
        marker = req.partition(";")[2].strip()
        if marker and "python_version" not in marker and "sys_platform" not in marker:
            continue
        try:
            _needs(_name(req), seen)
        except md.PackageNotFoundError:  # a marker that excluded it here (another platform)
            continue
    return seen


def test_nothing_the_base_install_needs_depends_on_protobuf():
    base = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    reached: set[str] = set()
    for requirement in base:
        _needs(_name(requirement), reached)
    assert {"textual", "psutil", "prometheus-client"} <= reached
    assert not reached & {"protobuf", "google-api-core", "googleapis-common-protos", "proto-plus", "grpcio"}, reached

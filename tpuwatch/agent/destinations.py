"""Where a viewer may ask the agent to write (checkpoints, profiles), and where files go first.

A viewer is another process (maybe another user over TCP with the run's token): it must not be
able to make the training process write anywhere it likes. Allowed roots are the run directory,
the script's own checkpoint directories, and what was listed on the ``run`` command line
(``TPUWATCH_ALLOWED_DESTINATIONS``, ``os.pathsep``-separated directories and ``gs://`` prefixes).

A ``gs://`` destination is first written locally under the run directory (the *staging*
directory), then uploaded (:mod:`tpuwatch.agent.gcs`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from tpuwatch import rundir, settings
from tpuwatch.agent import gcs
from tpuwatch.agent.agent_api import CommandRefused


@dataclass(frozen=True)
class Destination:
    """A resolved destination: ``url`` is what results name, ``local`` where files are written."""

    url: str  # an absolute local directory, or gs://bucket/prefix
    local: Path  # the directory written at the step boundary (the staging dir for gs://)
    gcs: gcs.GcsPath | None = None


def env_roots() -> list[str]:
    """The allowed roots listed in the environment.

    The list is ``os.pathsep``-separated, which on POSIX is ":" and so also splits "gs://b/p" into
    "gs" and "//b/p": such pairs are joined back.
    """
    parts = settings.ALLOWED_DESTINATIONS.get().split(os.pathsep)
    out: list[str] = []
    i = 0
    while i < len(parts):
        part = parts[i]
        if part == "gs" and i + 1 < len(parts) and parts[i + 1].startswith("//"):
            part = "gs:" + parts[i + 1]
            i += 1
        if part.strip():
            out.append(part)
        i += 1
    return out


def resolve(value: str | None, default: Path, run_dir: Path, staging: Path) -> Destination:
    """The destination for ``value`` (None or "": ``default``); relative paths are under run_dir.

    Raises CommandRefused for a malformed gs:// URL.
    """
    if not value:
        return Destination(str(default), default)
    if gcs.is_gcs(value):
        try:
            path = gcs.parse(value)
        except ValueError as e:
            raise CommandRefused(str(e)) from None
        return Destination(path.url(), staging / path.bucket / path.prefix, path)
    local = Path(value).expanduser()
    if not local.is_absolute():
        local = run_dir / local
    return Destination(str(local), local)


def check_allowed(dest: Destination, run_dir: Path, extra_roots: Iterable[str]) -> None:
    """Raises CommandRefused unless ``dest`` is inside an allowed root."""
    roots = [str(run_dir), *extra_roots, *env_roots()]
    if dest.gcs is not None:
        url = dest.url.rstrip("/")
        for root in roots:
            root = root.rstrip("/")
            if gcs.is_gcs(root) and (url == root or url.startswith(root + "/")):
                return
    else:
        real = os.path.realpath(dest.local)
        for root in roots:
            if gcs.is_gcs(root):
                continue
            base = os.path.realpath(Path(root).expanduser())
            if real == base or real.startswith(base.rstrip(os.sep) + os.sep):
                return
    raise CommandRefused(
        f"{dest.url} is outside the places this run may write to (the run directory, the script's checkpoint "
        f"directory, or what `tpuwatch run --allow-dest` listed); restart the run with --allow-dest {dest.url} "
        "or choose a destination inside the run directory")


def ensure_writable(directory: Path) -> None:
    """Creates ``directory`` (what it creates: mode 0700, a checkpoint or profile is the user's
    alone); raises OSError with a one-line reason naming what to fix."""
    try:
        rundir.make_private_dirs(directory)
    except OSError as e:
        raise OSError(f"cannot create {directory} ({e.strerror or e}); choose a directory you can write to "
                      "or fix its permissions") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise OSError(f"{directory} is not writable; choose a directory you can write to or fix its permissions")

"""Run directories: where a run's recording, output, socket and artefacts live.

Shared by the agent (inside training) and the monitor side; standard library only.

Layout of ``$TPUWATCH_HOME/runs/<run-id>/`` (mode 0700)::

    run.json      metadata, written by the launcher (atomically replaced on update)
    events.jsonl  every protocol message, appended by the agent
    output.log    the script's stdout and stderr
    agent.sock    the agent's Unix socket (0600)
    token         random token TCP viewers must present (0600)
    profiles/     profiler captures (TensorBoard/XProf layout)
    checkpoints/  checkpoints saved on request
    stacks/       stack dumps
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

EVENTS = "events.jsonl"
OUTPUT = "output.log"
META = "run.json"
SOCKET = "agent.sock"
TOKEN = "token"

#: Environment variables the launcher sets for the agent.
ENV_RUN_DIR = "TPUWATCH_RUN_DIR"
ENV_RUN_ID = "TPUWATCH_RUN_ID"
ENV_HOME = "TPUWATCH_HOME"

# AF_UNIX paths are limited to 108 bytes on Linux (104 on macOS).
_MAX_SOCKET_PATH = 100


def home() -> Path:
    """``$TPUWATCH_HOME`` or ``~/.tpuwatch``."""
    env = os.environ.get(ENV_HOME)
    return Path(env).expanduser() if env else Path.home() / ".tpuwatch"


def runs_root() -> Path:
    return home() / "runs"


def new_run_id(script: str, clock=time.time) -> str:
    stem = Path(script).stem.replace(" ", "_")[:40] or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(clock()))
    return f"{stamp}-{stem}-{secrets.token_hex(2)}"


def create(run_dir: Path) -> Path:
    """Creates ``run_dir`` (and parents) with mode 0700. Raises OSError when it cannot."""
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(run_dir, 0o700)
    probe = run_dir / ".write-test"
    probe.write_bytes(b"")
    probe.unlink()
    return run_dir


def socket_path(run_dir: Path) -> Path:
    """The agent socket for ``run_dir``; falls back to a short private temp path when too long."""
    path = run_dir / SOCKET
    if len(os.fsencode(str(path))) <= _MAX_SOCKET_PATH:
        return path
    base = Path(tempfile.gettempdir()) / f"tpuwatch-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    os.chmod(base, 0o700)
    return base / f"{run_dir.name[-60:]}.sock"


def write_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    """Atomically replaces run.json."""
    tmp = run_dir / f".{META}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True))
    os.replace(tmp, run_dir / META)


def update_meta(run_dir: Path, **changes: Any) -> dict[str, Any]:
    meta = read_meta(run_dir)
    meta.update(changes)
    write_meta(run_dir, meta)
    return meta


def read_meta(run_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((run_dir / META).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_token(run_dir: Path, token: str | None = None) -> str:
    """Writes the run's viewer token (0600): the one given, or a new random one."""
    token = token or secrets.token_urlsafe(24)
    path = run_dir / TOKEN
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def read_token(path: Path) -> str:
    return path.read_text().strip()


def hostname() -> str:
    return socket.gethostname()


def find_run(ref: str | None) -> Path:
    """A run directory from a reference: a path, a run id (or unique prefix), or None for the latest.

    Raises FileNotFoundError with a one-line message naming what to do.
    """
    root = runs_root()
    if ref:
        path = Path(ref).expanduser()
        if (path / EVENTS).exists() or (path / META).exists():
            return path
        candidates = sorted(p for p in root.glob(f"{ref}*") if p.is_dir()) if root.is_dir() else []
        if len(candidates) == 1:
            return candidates[0]
        if len(candidates) > 1:
            names = ", ".join(p.name for p in candidates[:5])
            raise FileNotFoundError(f"run {ref!r} is ambiguous ({names}...); give more of the id")
        raise FileNotFoundError(f"no run {ref!r} (not a run directory, nor a run id under {root}); `tpuwatch ls` lists runs")
    runs = [p for p in root.iterdir() if p.is_dir() and ((p / META).exists() or (p / EVENTS).exists())] if root.is_dir() else []
    if not runs:
        raise FileNotFoundError(f"no runs under {root}; start one with `tpuwatch run SCRIPT`")
    return max(runs, key=lambda p: (read_meta(p).get("started") or p.stat().st_mtime, p.name))

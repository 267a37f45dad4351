"""Opening the dashboard on a run directory, and why a viewer could show nothing."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpuwatch.sources.source import Source


def show(run_dir: Path, live: bool, speed: float | None = None, owner: bool = False,
         baseline=None) -> str:
    """Opens the dashboard on a run: live (tail the recording, send commands) or a replay.

    ``owner``: this process started the run, so it writes the findings into the recording.
    """
    from tpuwatch.monitor.group import worker_dirs
    from tpuwatch.ui.app import run_dashboard

    source: Source
    workers = worker_dirs(run_dir)
    if workers is not None:
        from tpuwatch.sources.group_source import (
            make_group_replay_source,
            make_group_source,
        )

        source = make_group_source(workers) if live else make_group_replay_source(workers, speed=speed or 1.0)
        # Findings go into the workers' recordings (owner only), not into the group directory.
        return run_dashboard(run_dir, source, record_findings=False)
    if live:
        from tpuwatch.control.client import AgentClient
        from tpuwatch.sources.file_source import make_file_source

        client = AgentClient.for_run(run_dir)
        source = make_file_source(run_dir, send=client.send)
    else:
        from tpuwatch.sources.replay_source import make_replay_source

        source = make_replay_source(run_dir, speed=speed or 1.0)
    return run_dashboard(run_dir, source, record_findings=owner, baseline=baseline)


def nothing_to_show(run_dir: Path) -> str:
    """Why a viewer of ``run_dir`` could show nothing at all ("" when it can)."""
    from tpuwatch.monitor.group import worker_dirs
    from tpuwatch.monitor.recording import recording_problem

    workers = worker_dirs(run_dir)
    problems = [recording_problem(w.path) for w in workers] if workers is not None else [recording_problem(run_dir)]
    return problems[0] if problems and all(problems) else ""

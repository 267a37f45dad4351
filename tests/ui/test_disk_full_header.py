"""A live dashboard says in its header when the run's disk is full."""

from __future__ import annotations

from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.ui.widgets.run_header import header_text, progress_parts


def test_the_header_leads_with_a_full_disk():
    snap = RunSnapshot(status="running", step=12, disk_full="the disk holding /r is full: ...")
    parts = progress_parts(snap)
    assert parts[0].startswith("DISK FULL") and "step 12" in parts[1]
    assert "DISK FULL" in str(header_text(snap, 120))
    assert not any("DISK" in p for p in progress_parts(RunSnapshot(status="running", step=12)))

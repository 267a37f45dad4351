"""Whether the disk under a run directory is full (the script's output and the recording are
then being dropped and counted by the agent: a full disk never stops training)."""

from __future__ import annotations

import os
from pathlib import Path

#: Below this many free bytes the disk counts as full (the agent's writes are failing or about to).
FULL_BELOW_BYTES = 64 * 1024


def full_note(path: str | os.PathLike[str]) -> str:
    """One line when the file system holding ``path`` is full, else "". One statvfs call."""
    try:
        st = os.statvfs(path)
    except OSError:
        return ""
    # root may write into the blocks reserved for it; everyone else stops at f_bavail.
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
    if free >= FULL_BELOW_BYTES:
        return ""
    return (f"the disk holding {Path(path)} is full: the script's output and the recording are being "
            "dropped (training goes on; the recording says what was lost once space returns)")

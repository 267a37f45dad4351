"""Which lines of a recorded run's output a replay shows at its current position.

output.log has no timestamps, so the replay places its lines by anchors the recording does have:
Keras prints ``Epoch k/N`` when epoch k begins, which the recording marks with ``epoch`` messages
(begin and end). An epoch's header shows when it begins in the replay, the lines after it (its
summary) when it ends. Output without such anchors is revealed in proportion to the replay's position,
which is approximate; the panel says so.
"""

from __future__ import annotations

import re
from typing import Sequence

EPOCH_LINE = re.compile(r"^Epoch (\d+)/\d+")


def epoch_anchors(lines: Sequence[str]) -> list[int]:
    """Indexes of the ``Epoch k/N`` lines, in order."""
    return [i for i, line in enumerate(lines) if EPOCH_LINE.match(line)]


def visible_lines(n_lines: int, anchors: Sequence[int], epochs_begun: int, epochs_ended: int,
                  fraction: float, ended: bool) -> int:
    """How many of the output's first lines the replay shows.

    ``epochs_begun``/``epochs_ended``: epochs begun/ended so far in the replay; ``fraction``: the
    replay's position in the recording, 0..1; ``ended``: the replay has reached the run's end."""
    if ended:
        return n_lines
    if not anchors:
        return max(0, min(n_lines, int(n_lines * fraction)))
    shown = anchors[0]  # what the script printed before its first epoch
    if epochs_begun:
        shown = anchors[min(epochs_begun, len(anchors)) - 1] + 1  # through the current epoch's header
    if epochs_ended:
        shown = max(shown, anchors[epochs_ended] if epochs_ended < len(anchors) else n_lines)
    return shown

"""The agent's clocks, taken when the agent is imported, before the script runs.

A script that patches ``time.time`` (a mock, freezegun, a simulated clock) or ``time.monotonic``
changes its own idea of time, never the run's: every time the agent records or measures comes from
these references (a patched ``time.time`` made a run last "1h00m")."""

from __future__ import annotations

import time

wall = time.time
monotonic = time.monotonic
perf = time.perf_counter

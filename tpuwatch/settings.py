"""Every ``TPUWATCH_*`` environment variable: its name, default, meaning and parsing, here and
nowhere else. Standard library only (the agent reads these too). Tests override a variable by
setting it in the child's environment, never by patching this module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

PREFIX = "TPUWATCH_"


@dataclass(frozen=True)
class Variable:
    """One environment variable: ``name``, the ``default`` used when it is unset, what it does."""

    name: str
    default: str
    doc: str

    def get(self, env: Mapping[str, str] | None = None) -> str:
        """The raw value (``default`` when unset) from ``env`` (default ``os.environ``)."""
        return (os.environ if env is None else env).get(self.name, self.default)

    def positive_float(self, env: Mapping[str, str] | None = None) -> float:
        """The value as a number > 0; the default when unset, unparseable or not positive."""
        try:
            value = float(self.get(env))
        except ValueError:
            return float(self.default)
        return value if value > 0 else float(self.default)


# --- where runs live (read on both sides) ----------------------------------------------------------

HOME = Variable("TPUWATCH_HOME", "", "Where runs are recorded (``$TPUWATCH_HOME/runs/<run-id>/``); "
                "default ``~/.tpuwatch``.")
RUN_DIR = Variable("TPUWATCH_RUN_DIR", "", "Set by the launcher for the agent: the run directory to record into.")
RUN_ID = Variable("TPUWATCH_RUN_ID", "", "Set by the launcher for the agent: the run's id (the directory it made).")
PACKAGE_PATH = Variable("TPUWATCH_PACKAGE_PATH", "", "Set by the launcher for the agent: the directory it put "
                       "first on PYTHONPATH so the agent imports tpuwatch; the agent takes it off again, so the "
                       "script sees the PYTHONPATH and sys.path plain python gives it.")

# --- remote viewers ---------------------------------------------------------------------------------

TOKEN = Variable("TPUWATCH_TOKEN", "", "A viewer token shared by every host of a job (``run --listen``: written "
                 "to each run directory instead of a random one; ``attach HOST:PORT``: presented to the agents). "
                 "At least 16 characters.")
ALLOWED_DESTINATIONS = Variable("TPUWATCH_ALLOWED_DESTINATIONS", "", "Set by ``tpuwatch run --allow-dest`` for "
                                "the agent: ``os.pathsep``-separated directories and ``gs://`` prefixes a viewer "
                                "may write profiles and checkpoints to, besides the run's own.")

# --- the viewer ---------------------------------------------------------------------------------------

STOP_GRACE_S = Variable("TPUWATCH_STOP_GRACE_S", "15", "Seconds ``tpuwatch run`` waits after SIGINT before "
                        "SIGTERM, and after SIGTERM before SIGKILL, when the user stops the run.")
NOTIFY_TIMEOUT_S = Variable("TPUWATCH_NOTIFY_TIMEOUT_S", "10", "Seconds a ``--notify`` command may run on one "
                            "event before it is killed (with everything it started), counted and reported.")
# Set by ``--notify`` for its command (docs/alerts.md); the event itself is JSON on the command's stdin.
EVENT_KIND = Variable("TPUWATCH_EVENT_KIND", "", "Set for a ``--notify`` command: finding, stall, crash or end.")
EVENT_RULE = Variable("TPUWATCH_EVENT_RULE", "", "Set for a ``--notify`` command: the finding's rule (\"\" for "
                      "crash and end).")
EVENT_SEVERITY = Variable("TPUWATCH_EVENT_SEVERITY", "", "Set for a ``--notify`` command: info, warning or critical.")
EVENT_RUN = Variable("TPUWATCH_EVENT_RUN", "", "Set for a ``--notify`` command: the run id.")
EVENT_STATUS = Variable("TPUWATCH_EVENT_STATUS", "", "Set for a ``--notify`` command: the run's status (running, "
                        "stalled, finished, crashed, ...).")
EVENT_MESSAGE = Variable("TPUWATCH_EVENT_MESSAGE", "", "Set for a ``--notify`` command: the event in one line "
                         "(run, what, step, message), for a notification or a mail subject.")

# --- the agent (read inside the training process) ---------------------------------------------------

SAMPLE_HZ = Variable("TPUWATCH_SAMPLE_HZ", "4", "The agent's sampling rate (host and device memory, flushes), "
                     "the default of ``--sample-hz``.")
LISTEN = Variable("TPUWATCH_LISTEN", "", "The default of the agent's ``--listen HOST:PORT``.")
DISABLE = Variable("TPUWATCH_DISABLE", "", "The default of the agent's ``--disable``: comma-separated probes "
                   "to leave off.")
VIEWER_TIMEOUT_S = Variable("TPUWATCH_VIEWER_TIMEOUT_S", "30", "Seconds a viewer may take nothing before the "
                            "agent drops it (it can re-attach).")
TEARDOWN_S = Variable("TPUWATCH_TEARDOWN_S", "10", "Seconds the agent lets TensorFlow tear down at interpreter "
                      "exit before it ends the process; 0 turns the guard off.")
LOSS_EVERY_S = Variable("TPUWATCH_LOSS_EVERY_S", "", "Least seconds of training between two reads of the "
                        "replicas' losses and fit's in-graph input wait. Unset: every step call of a run's first "
                        "256 while the reads cost at most 1 % of the training, then at most every 0.25 s; set, it "
                        "applies from the first call (0: every call).")
STALL_STACKS_S = Variable("TPUWATCH_STALL_STACKS_S", "", "Seconds without a step after which the agent takes "
                         "every thread's stack by itself (once per stall, into <run_dir>/stacks/). Unset: the stall "
                         "rule's limit for a gap, by the run's own cadence (300 x the p95 step interval, at least 10 s, "
                         "at most 60 s or 20 x the median interval).")
TEST_FAIL_PROBE = Variable("TPUWATCH_TEST_FAIL_PROBE", "", "Tests only: the probe whose installation fails on "
                           "purpose (fault injection).")

#: Every variable above, for ``doctor`` and the docs.
ALL = (HOME, RUN_DIR, RUN_ID, PACKAGE_PATH, TOKEN, ALLOWED_DESTINATIONS, STOP_GRACE_S, NOTIFY_TIMEOUT_S, EVENT_KIND,
       EVENT_RULE, EVENT_SEVERITY, EVENT_RUN, EVENT_STATUS, EVENT_MESSAGE, SAMPLE_HZ, LISTEN, DISABLE,
       VIEWER_TIMEOUT_S, TEARDOWN_S, LOSS_EVERY_S, STALL_STACKS_S, TEST_FAIL_PROBE)

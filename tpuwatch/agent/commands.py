"""Registers the actions a viewer can ask for: ``profile`` and ``checkpoint``.

Both run on the training thread at the next step boundary (``at_step_boundary=True``) and are
validated on receipt, so a bad request is refused at once with a one-line reason. Each gets
exactly one Result; those that finish on a helper thread (a profile's export, a gs:// upload)
send it from there, and at the end of the script we wait (bounded) for them, so that no command
is left without its Result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpuwatch.agent.checkpointing import Checkpointer
from tpuwatch.agent.profiler import Profiler

if TYPE_CHECKING:
    from tpuwatch.agent.patches import Patches
    from tpuwatch.agent.runtime import Agent


@dataclass(frozen=True)
class Commands:
    profiler: Profiler
    checkpointer: Checkpointer


def install(agent: "Agent", patches: "Patches") -> Commands:
    profiler = Profiler(agent)
    checkpointer = Checkpointer(agent)
    checkpointer.install(patches)
    agent.register("profile", profiler.handle, at_step_boundary=True, validate=profiler.validate)
    agent.register("checkpoint", checkpointer.handle, at_step_boundary=True, validate=checkpointer.validate)

    # The runner calls fail_pending once the script has returned: the moment to end a capture
    # still running and to let uploads finish, while the recording is still open.
    def make_fail_pending(original):
        def fail_pending(reason: str) -> None:
            original(reason)
            for name, part in (("profile", profiler), ("checkpoint", checkpointer)):
                try:
                    part.shutdown()
                except Exception as e:
                    agent.event("error", f"command:{name}", f"could not finish {name} at exit: {type(e).__name__}: {e}")

        return fail_pending

    patches.wrap(agent, "fail_pending", make_fail_pending)
    return Commands(profiler, checkpointer)

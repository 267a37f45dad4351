"""Registers the TensorFlow actions a viewer can ask for: ``profile`` and ``checkpoint``.

Both run on the training thread at the next step boundary (``at_step_boundary=True``) and are
validated on receipt, so a bad request is refused at once with a one-line reason. (``stop`` needs no TensorFlow: it is
registered with the agent itself, :mod:`tpuwatch.agent.stopper`.) Each gets
exactly one Result; those that finish on a helper thread (a profile's export, a gs:// upload)
send it from there, and at the end of the script we wait (bounded) for them, so that no command
is left without its Result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuwatch.agent.checkpointing import Checkpointer
from tpuwatch.agent.profiler import Profiler

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.patches import Patches
    from tpuwatch.protocol import Command


@dataclass(frozen=True)
class Commands:
    profiler: Profiler
    checkpointer: Checkpointer


def install(agent: "Agent", patches: "Patches") -> Commands:
    profiler = Profiler(agent)
    checkpointer = Checkpointer(agent)
    checkpointer.install(patches)
    agent.register("profile", profiler.handle, at_step_boundary=True, validate=profiler.validate)

    def checkpoint(cmd: Command) -> tuple[str | None, dict[str, Any]]:
        with agent.phases.during("checkpointing", "tpuwatch checkpoint"):
            return checkpointer.handle(cmd)

    agent.register("checkpoint", checkpoint, at_step_boundary=True, validate=checkpointer.validate)

    # Once the script has returned: end a capture still running and let uploads finish, while
    # the recording is still open.
    agent.on_shutdown(profiler.shutdown)
    agent.on_shutdown(checkpointer.shutdown)
    return Commands(profiler, checkpointer)

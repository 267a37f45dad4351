"""Installs every probe, each on its own: one that cannot install is reported and left out."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from tpuwatch.agent.patches import Patches

if TYPE_CHECKING:
    from tpuwatch.agent.runtime import Agent


def install_all(agent: "Agent", script: str, argv: list[str], disabled: set[str]) -> Patches:
    """Installs the probes (except ``disabled``) and emits the hello. Never raises."""
    patches = Patches()
    announce = None
    try:
        from tpuwatch.agent import environment

        agent.emit(environment.hello(agent.run_id, script, argv, clock=agent.clock))
        if "environment" not in disabled:
            environment.install(agent, patches)
            announce = lambda strategy: environment.announce(agent, strategy)  # noqa: E731
    except Exception as e:
        agent.probe_failed("environment", e)

    step_probe = None
    if "steps" not in disabled:
        try:
            from tpuwatch.agent import steps

            step_probe = steps.install(agent, patches)
        except Exception as e:
            agent.probe_failed("steps", e)
    if step_probe is not None:
        for name in ("input_wait", "replica_loss"):
            if name in disabled:
                continue
            try:
                module = importlib.import_module(f"tpuwatch.agent.{name}")
                if name == "replica_loss":
                    module.install(agent, patches, step_probe, announce)
                else:
                    module.install(agent, patches, step_probe)
            except Exception as e:
                agent.probe_failed(name, e)
        agent.step_probe = step_probe
    for name in ("retraces", "memory", "keras_hooks", "stacks", "commands"):
        if name in disabled:
            continue
        try:
            module = importlib.import_module(f"tpuwatch.agent.{name}")
            installed = module.install(agent, patches)
        except Exception as e:
            agent.probe_failed(name, e)
            continue
        if name == "keras_hooks" and step_probe is not None:
            step_probe.epoch_source = installed
    return patches


def uninstall(patches: Patches) -> None:
    """Undoes every patch and pending import hook (the script has ended)."""
    from tpuwatch.agent import post_import

    patches.restore()
    post_import.cancel_all()

"""Installs every probe, each on its own: one that cannot install is reported and left out.

The TensorFlow probes go in when the script imports TensorFlow (not before): whatever the script
sets up before ``import tensorflow`` (``TF_CPP_MIN_LOG_LEVEL``, ``TF_USE_LEGACY_KERAS``,
``CUDA_VISIBLE_DEVICES``, ...) then works exactly as it does without tpuwatch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from tpuwatch.agent.patches import Patches

if TYPE_CHECKING:
    from tpuwatch.agent.runtime import Agent


def install_all(agent: "Agent", script: str, argv: list[str], disabled: set[str]) -> Patches:
    """Emits the hello and installs the probes (except ``disabled``) as soon as the script imports
    TensorFlow (at once if it is imported already). Never raises."""
    from tpuwatch.agent import environment, post_import

    patches = Patches()
    try:
        agent.emit(environment.hello(agent.run_id, script, argv, clock=agent.clock))
    except Exception as e:
        agent.probe_failed("environment", e)
    from tpuwatch.agent import phases

    agent.phases.enabled = phases.PROBE not in disabled
    try:
        agent.phases.start(phases.process_start_time(agent.phases.since))
    except Exception as e:
        agent.probe_failed(phases.PROBE, e)
    from tpuwatch.agent.stopper import Stopper

    agent.register("stop", Stopper(agent).handle, at_step_boundary=False)  # works without TensorFlow
    post_import.when_imported("tensorflow", lambda _tf: install_tf_probes(agent, patches, disabled),
                              lambda e: agent.probe_failed("agent", e))
    return patches


def install_tf_probes(agent: "Agent", patches: Patches, disabled: set[str]) -> None:
    """Installs every TensorFlow probe; each failure disables only that probe."""
    announce = training = None
    try:
        from tpuwatch.agent import environment

        if "environment" not in disabled:
            environment.install(agent, patches)
            announce = lambda strategy: environment.announce(agent, strategy)  # noqa: E731
            training = lambda strategy: environment.training_strategy(agent, strategy)  # noqa: E731
    except Exception as e:
        agent.probe_failed("environment", e)

    step_probe = None
    if "steps" not in disabled:
        try:
            from tpuwatch.agent import steps

            step_probe = steps.install(agent, patches)
            step_probe.on_training_strategy = training
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
    for name in ("phases", "retraces", "pipeline_map", "leak_doctor", "gap_sampler", "teardown", "memory",
                 "keras_hooks", "stacks", "commands", "auto_profile", "traceback_filters"):
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
        if name == "retraces":
            agent.retrace_probe = installed  # the leak doctor leaves growth with traces alone
        elif name == "pipeline_map":
            agent.pipeline_map = installed  # the leak doctor reads what the pipelines hold
        elif name == "leak_doctor":
            agent.leak_doctor = installed  # the auto-profile waits while its window samples
        elif name == "commands":
            agent.profiler = installed.profiler  # the auto-profile captures through it


def uninstall(patches: Patches) -> None:
    """Undoes every patch and pending import hook (the script has ended)."""
    from tpuwatch.agent import post_import

    patches.restore()
    post_import.cancel_all()

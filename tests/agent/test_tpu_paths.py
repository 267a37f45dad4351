"""The TPU code paths cannot run here (no TPU); what can be checked is that they are chosen:
the TPU strategies' own run() implementations are patched, and restored."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.tf


def test_tpu_strategies_run_is_patched_and_restored(tmp_path):
    from tensorflow.python.distribute import (
        distribute_lib,
        one_device_strategy,
        tpu_strategy,
    )

    from tpuwatch.agent import post_import, probes
    from tpuwatch.agent.runtime import Agent

    owners = [tpu_strategy.TPUStrategyV2, tpu_strategy.TPUStrategy, tpu_strategy.TPUStrategyV1,
              one_device_strategy.OneDeviceStrategy, distribute_lib.StrategyBase]
    before = {cls: vars(cls)["run"] for cls in owners}
    agent = Agent(tmp_path, "t")
    patches = probes.install_all(agent, "t.py", ["t.py"], set())  # TF is imported: installs at once
    try:
        for cls in owners:
            run = vars(cls)["run"]
            assert run is not before[cls], cls
            assert run.__tpuwatch_original__ is before[cls], cls
        assert not agent.disabled_probes, agent.disabled_probes
    finally:
        probes.uninstall(patches)
        post_import.cancel_all()
        agent.stop()
    for cls in owners:
        assert vars(cls)["run"] is before[cls]

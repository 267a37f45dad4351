"""The relay: one thread tails a run for --notify, --metrics and --tensorboard."""

from __future__ import annotations

import shutil
from pathlib import Path

from tpuwatch.console.relay import Relay, relay_source
from tpuwatch.protocol import Step

DATA = Path(__file__).resolve().parents[1] / "data"


class Recorder:
    def __init__(self) -> None:
        self.steps: list[int] = []
        self.updates = 0
        self.closed = None

    def take(self, worker, msg):
        if isinstance(msg, Step):
            self.steps.append(msg.step)

    def update(self, snap, new_findings):
        self.updates += 1

    def close(self, snap, new_findings):
        self.closed = snap


class Broken(Recorder):
    def take(self, worker, msg):
        raise OSError(28, "No space left on device")


def test_a_failing_outlet_is_dropped_and_said_the_others_see_the_whole_run(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    shutil.copy(DATA / "crashed.jsonl", run_dir / "events.jsonl")
    good, broken = Recorder(), Broken()
    relay = Relay(relay_source(run_dir), lambda: False, [broken, good], poll_s=0.01, exit_grace_s=0.1).start()
    final = relay.close(timeout_s=30)
    assert relay.error is None
    assert relay.errors == ["Broken stopped: OSError: [Errno 28] No space left on device"]
    assert good.steps and good.steps == sorted(good.steps) and good.steps[-1] == final.step == 150
    assert good.closed is final and final.status == "crashed" and broken.closed is None

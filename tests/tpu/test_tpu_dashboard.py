"""End to end without a TPU: the real agent thread runs the TPU metrics sampler against the fake
libtpu service, records events.jsonl; the dashboard and ``tpuwatch report`` read that recording."""

from __future__ import annotations

import asyncio
import re
import time

from textual.widgets import Static
from tpu_fakes import FakeMetricService, make_sysfs, point_tpu_info_at

from tpuwatch import rundir
from tpuwatch.agent import environment, tpu_metrics
from tpuwatch.agent.patches import Patches
from tpuwatch.agent.runtime import Agent
from tpuwatch.console import report
from tpuwatch.monitor.recording import read_all
from tpuwatch.protocol import DeviceSample, Event
from tpuwatch.sources.replay_source import ReplaySource
from tpuwatch.ui.app import TpuwatchApp


def _wait(pred, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _record(run, monkeypatch, tmp_path) -> list:
    """Runs the agent's sampler thread: service up, then stopped; returns the recording."""
    point_tpu_info_at(monkeypatch, make_sysfs(tmp_path / "sys", "v4", count=4))
    svc = FakeMetricService().start()
    monkeypatch.setenv("TPU_RUNTIME_METRICS_PORTS", str(svc.port))
    agent = Agent(run, "tpu-dash", sample_hz=20)
    agent.emit(environment.hello("tpu-dash", "train.py", ["train.py"]))
    sampler = tpu_metrics.install(agent, Patches())
    sampler.interval_s, sampler.backoff_s = 0.1, 0.1
    agent.start()
    try:
        _wait(lambda: svc.served.calls >= 6)  # two readings
        assert tpu_metrics.covered_devices(agent) == {"TPU:0", "TPU:1", "TPU:2", "TPU:3"}
        svc.stop()
        _wait(lambda: sampler.reason)
    finally:
        agent.stop()
        svc.stop()
    messages, _ = read_all(run / rundir.EVENTS)
    return messages


async def _memory_panel(messages) -> str:
    src = ReplaySource(messages, paused=True, clock=lambda: 0.0)
    src.seek_end()
    app = TpuwatchApp(src, refresh_hz=0)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        return str(app.query_one("#memory > .body", Static).render())


def test_dashboard_and_report_show_libtpu_numbers_then_the_reason(tmp_path, monkeypatch):
    run = tmp_path / "run"
    rundir.create(run)
    messages = _record(run, monkeypatch, tmp_path)
    devs = [m for m in messages if isinstance(m, DeviceSample)]
    assert {d.device for d in devs} == {"TPU:0", "TPU:1", "TPU:2", "TPU:3"}
    notes = [m.message for m in messages if isinstance(m, Event) and m.source == "tpu-metrics"]
    assert notes[0].startswith("TPU metrics from libtpu on port")
    assert notes[-1].startswith("TPU metrics unavailable: TPU metrics service unreachable on port")

    # While the service answered: HBM used/total, headroom and duty cycle per device.
    while_up = messages[: messages.index(devs[-1]) + 1]
    panel = asyncio.run(_memory_panel(while_up))
    lines = {line.split()[0]: line for line in panel.splitlines() if line.startswith("TPU:")}
    assert set(lines) == {"TPU:0", "TPU:1", "TPU:2", "TPU:3"}
    assert lines["TPU:3"] == "TPU:3 30.0/32.0 GiB 94%  2.00 GiB free  duty 99%"
    assert lines["TPU:0"] == "TPU:0 3.00/32.0 GiB 9.4%  29.0 GiB free  duty 12%"
    assert "unreachable" not in panel

    # After it stopped: the one-line reason, the last numbers still shown.
    panel = asyncio.run(_memory_panel(messages))
    assert panel.splitlines()[-1].startswith("TPU metrics service unreachable on port")
    assert "TPU:3" in panel

    text = report.render_text(report.build_model(run))
    assert re.search(r"\n  TPU metrics +TPU metrics service unreachable on port \d+\n", text), text
    assert report.build_report(run)["summary"]["memory"]["tpu_metrics_note"].startswith("TPU metrics service")

"""The agent's TPU metrics sampler against a real gRPC RuntimeMetricService on 127.0.0.1 and a
fake PCI sysfs tree: served numbers come out as DeviceSamples, absence comes out as one reason."""

from __future__ import annotations

import sys

import pytest
from tpu_fakes import (
    Clock,
    FakeMetricService,
    GiB,
    Served,
    make_sysfs,
    point_tpu_info_at,
)

from tpuwatch import rundir
from tpuwatch.agent import tpu_metrics
from tpuwatch.agent.runtime import Agent
from tpuwatch.monitor.state import RunState
from tpuwatch.protocol import DeviceSample, Event


@pytest.fixture
def agent(tmp_path):
    run = tmp_path / "run"
    rundir.create(run)
    a = Agent(run, "tpu-test")
    yield a
    a.stop()


@pytest.fixture
def v4_host(tmp_path, monkeypatch):
    point_tpu_info_at(monkeypatch, make_sysfs(tmp_path / "sys", "v4", count=4))


@pytest.fixture
def service():
    svc = FakeMetricService().start()
    yield svc
    svc.stop()


def samples(msgs) -> dict[str, DeviceSample]:
    return {m.device: m for m in msgs if isinstance(m, DeviceSample)}


def events(msgs) -> list[Event]:
    return [m for m in msgs if isinstance(m, Event)]


def test_chips_are_found_in_the_fake_sysfs_only_by_google_vendor(tmp_path, monkeypatch):
    point_tpu_info_at(monkeypatch, make_sysfs(tmp_path / "a", "v5e", count=8, others=3))
    chip, count, reason = tpu_metrics.find_chips()
    assert (chip.value.name, count, reason) == ("v5e", 8, "")
    point_tpu_info_at(monkeypatch, make_sysfs(tmp_path / "b", "v4", count=0, others=3))
    assert tpu_metrics.find_chips() == (None, 0, tpu_metrics.NO_CHIPS)


def test_ports_from_the_environment():
    assert tpu_metrics.metrics_ports({}) == (8431,)
    assert tpu_metrics.metrics_ports({"TPU_RUNTIME_METRICS_PORTS": "8431, 8432"}) == (8431, 8432)
    with pytest.raises(ValueError, match="TPU_RUNTIME_METRICS_PORTS='84x'"):
        tpu_metrics.metrics_ports({"TPU_RUNTIME_METRICS_PORTS": "84x"})


def test_served_hbm_and_duty_cycle_become_device_samples(agent, v4_host, service):
    sampler = tpu_metrics.TpuMetricsSampler(agent, ports=(service.port,), clock=Clock())
    out = sampler()
    got = samples(out)
    assert sorted(got) == ["TPU:0", "TPU:1", "TPU:2", "TPU:3"]
    assert got["TPU:3"].current_bytes == 30 * GiB and got["TPU:3"].limit_bytes == 32 * GiB
    assert got["TPU:0"].duty_cycle_pct == 12.5 and got["TPU:2"].duty_cycle_pct == 75.0
    assert {s.source for s in got.values()} == {"tpu-info"} and got["TPU:1"].limit_source == "libtpu"
    (ev,) = events(out)
    assert ev.source == "tpu-metrics" and ev.level == "info"
    assert ev.message == f"TPU metrics from libtpu on port {service.port}: 4 x TPU v4 chip"
    # The peak is the largest usage this sampler has seen.
    service.served.used[3] = 10 * GiB
    sampler.clock.advance(1.0)
    later = samples(sampler())
    assert later["TPU:3"].current_bytes == 10 * GiB and later["TPU:3"].peak_bytes == 30 * GiB
    assert not events(sampler())  # within the interval: nothing, and no call
    assert service.served.calls == 6


def test_duty_cycle_is_per_chip_on_two_core_chips(agent, tmp_path, monkeypatch):
    point_tpu_info_at(monkeypatch, make_sysfs(tmp_path / "sys", "v3", count=2))
    svc = FakeMetricService(Served(used=[1 * GiB, 2 * GiB, 3 * GiB, 4 * GiB], total=[16 * GiB] * 4,
                                   duty=[40.0, 90.0])).start()
    try:
        got = samples(tpu_metrics.TpuMetricsSampler(agent, ports=(svc.port,))())
    finally:
        svc.stop()
    assert [got[f"TPU:{i}"].duty_cycle_pct for i in range(4)] == [40.0, 40.0, 90.0, 90.0]
    assert got["TPU:2"].current_bytes == 3 * GiB and got["TPU:2"].limit_bytes == 16 * GiB


def test_stopped_service_gives_one_reason_backs_off_and_recovers(agent, v4_host, service):
    clock = Clock()
    sampler = tpu_metrics.TpuMetricsSampler(agent, ports=(service.port,), clock=clock, backoff_s=2.0)
    assert samples(sampler())
    assert sampler.covered == {"TPU:0", "TPU:1", "TPU:2", "TPU:3"}
    service.stop()
    clock.advance(1.0)
    out = sampler()
    assert sampler.covered == frozenset()  # TF's own memory figures are the fallback again
    (ev,) = events(out)
    assert not samples(out)
    assert ev.level == "warning"
    assert ev.message == f"TPU metrics unavailable: TPU metrics service unreachable on port {service.port}"
    # Backing off: the next tries come after 2 s, then 4 s, and repeat no reason.
    calls = service.served.calls
    clock.advance(1.0)
    assert sampler() == []
    clock.advance(1.5)
    assert sampler() == []  # tried (refused) and still the same reason: said once only
    clock.advance(3.0)
    assert sampler() == []  # 4 s backoff not over yet: not tried
    service.start()  # libtpu is back, same port
    clock.advance(1.1)
    out = sampler()
    assert samples(out)["TPU:0"].current_bytes == 3 * GiB
    assert [e.level for e in events(out)] == ["info"]
    assert service.served.calls == calls + 3


def test_a_hung_service_costs_the_agent_thread_one_short_deadline(agent, v4_host, service):
    service.served.delay_s = 2.0
    sampler = tpu_metrics.TpuMetricsSampler(agent, ports=(service.port,), timeout_s=0.2, clock=Clock())
    out = sampler()
    # The service answers after 2 s: "unreachable" and no sample mean the call gave up at its
    # 0.2 s deadline rather than waiting for the answer.
    assert "unreachable on port" in events(out)[0].message
    assert not samples(out)


def test_no_chips_and_missing_tpu_info_are_said_once_and_final(agent, tmp_path, monkeypatch):
    point_tpu_info_at(monkeypatch, make_sysfs(tmp_path / "sys", "v4", count=0))
    sampler = tpu_metrics.TpuMetricsSampler(agent, clock=Clock())
    (ev,) = sampler()
    assert (ev.level, ev.message) == ("info", "TPU metrics unavailable: no TPU chips found")
    assert sampler.done and sampler() == []
    monkeypatch.setitem(sys.modules, "tpu_info", None)  # as if tpu-info were not installed
    (ev,) = tpu_metrics.TpuMetricsSampler(agent)()
    assert ev.message == "TPU metrics unavailable: tpu-info not installed (pip install 'tpuwatch[tpu]')"
    assert tpu_metrics.read_once().reason == tpu_metrics.NOT_INSTALLED


def test_an_error_answer_is_a_reason_not_a_crash(agent, v4_host, service):
    # A libtpu that does not know the metric names (older/newer runtime): NOT_FOUND.
    from tpu_info.metrics import MetricName

    service.served.missing.add(MetricName.TOTAL_MEMORY.value)
    out = tpu_metrics.TpuMetricsSampler(agent, ports=(service.port,), clock=Clock())()
    (ev,) = events(out)
    assert ev.message == (f"TPU metrics unavailable: TPU metrics service on port {service.port} answered "
                          "NOT_FOUND: metric tpu.runtime.hbm.memory.total.bytes not found")


def test_read_once_for_the_doctor(v4_host, service):
    r = tpu_metrics.read_once(ports=(1, service.port), timeout_s=0.5)  # port 1 refuses: the next answers
    assert r.ok and r.port == service.port and r.chips == 4 and len(r.usage) == 4
    service.stop()
    r = tpu_metrics.read_once(ports=(service.port,))
    assert not r.ok and r.reason == f"TPU metrics service unreachable on port {service.port}"


def test_run_state_takes_the_note_from_the_reason_and_clears_it(agent, v4_host, service):
    clock = Clock()
    sampler = tpu_metrics.TpuMetricsSampler(agent, ports=(service.port,), clock=clock)
    state = RunState(clock=lambda: 0.0)
    state.apply_all(sampler())
    snap = state.snapshot()
    assert snap.tpu_metrics_note == ""
    assert {d.device: d.duty_cycle_pct for d in snap.device_memory}["TPU:3"] == 99.0
    service.stop()
    clock.advance(1.0)
    state.apply_all(sampler())
    assert state.snapshot().tpu_metrics_note == f"TPU metrics service unreachable on port {service.port}"
    service.start()
    clock.advance(2.0)
    state.apply_all(sampler())
    assert state.snapshot().tpu_metrics_note == ""


def test_repeated_reads_sample_every_device(agent, v4_host, service):
    """Fifty reads in a row each give all four chips. What a read costs the agent thread is not
    asserted here: a timing on a shared box is a benchmark's job."""
    sampler = tpu_metrics.TpuMetricsSampler(agent, ports=(service.port,), interval_s=0.0)
    sampler()  # connect
    for _ in range(50):
        assert len(samples(sampler())) == 4

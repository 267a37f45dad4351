"""The agent's samplers: the ones at the sample rate, and the ones that ask for their own pace
(the agent's thread wakes for those: ~125 µs of CPU a wake here, whatever the sampler does)."""

from __future__ import annotations

from pytest import approx

from tpuwatch.agent.sampler_set import MIN_PACE_S, SamplerSet


def _set():
    disabled: dict[str, str] = {}
    failed: list[str] = []

    def probe_failed(name, e):
        disabled[name] = str(e)
        failed.append(name)

    return SamplerSet(disabled, probe_failed), disabled, failed


def test_a_sampler_at_its_own_pace_runs_when_due_and_says_when_it_is_due_next():
    samplers, _, _ = _set()
    calls = []
    samplers.add("fast", lambda: calls.append(1) or [], every_s=0.05)
    assert samplers.sample_fast(10.0, print) == approx(10.05) and len(calls) == 1
    assert samplers.sample_fast(10.02, print) == approx(10.05) and len(calls) == 1  # not due yet
    assert samplers.sample_fast(10.05, print) == approx(10.1) and len(calls) == 2


def test_a_pace_given_by_the_sampler_is_asked_after_each_call():
    samplers, _, _ = _set()
    paces = iter([0.05, 0.25])
    samplers.add("fast", lambda: [], every_s=lambda: next(paces))
    assert samplers.sample_fast(1.0, print) == approx(1.05)
    assert samplers.sample_fast(1.05, print) == approx(1.3)


def test_a_sampler_that_fails_wakes_the_agent_no_more():
    samplers, _, failed = _set()

    def broken():
        raise RuntimeError("bug")

    samplers.add("broken", broken, every_s=0.05)
    samplers.sample_fast(1.0, print)
    assert failed == ["broken"]
    assert samplers.sample_fast(2.0, print) == float("inf")


def test_a_pace_that_fails_or_is_nothing_never_stops_or_spins_the_agent_thread():
    samplers, _, failed = _set()

    def bad_pace():
        raise ValueError("no pace")

    samplers.add("bad", lambda: [], every_s=bad_pace)
    samplers.add("zero", lambda: [], every_s=0)
    samplers.add("whole", lambda: [], every_s=1)  # an int
    assert samplers.sample_fast(5.0, print) == approx(5.0 + MIN_PACE_S)  # "zero" asks again no sooner
    assert failed == ["bad"]
    assert samplers.sample_fast(5.0 + MIN_PACE_S, print) == approx(5.0 + 2 * MIN_PACE_S)

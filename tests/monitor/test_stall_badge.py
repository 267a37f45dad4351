"""During a hang the STALLED badge and the Findings panel say the same thing
at the same time, and steps/s does not keep its pre-hang value."""

from __future__ import annotations

import pytest
from monitor_recordings import mr, step

from tpuwatch.monitor.monitor import Monitor
from tpuwatch.protocol import Exit, HostSample, Step


def hang_after(last: int) -> tuple[list, float]:
    """A healthy 3-epoch run (100 steps an epoch, 300 planned) that hangs after ``step`` while
    its agent keeps sampling (the process is alive) for 10 minutes."""
    msgs = [m for m in mr.healthy_messages(300) if not isinstance(m, Exit)]
    last_t = next(m.t for m in msgs if isinstance(m, Step) and m.step == last)
    msgs = [m for m in msgs if getattr(m, "t", 0.0) <= last_t]
    msgs += [HostSample(t=last_t + 0.5 * i, rss_bytes=1 << 30, available_bytes=8 << 30,
                        total_bytes=16 << 30, cpu_percent=3.0) for i in range(1, 1200)]
    return msgs, last_t


@pytest.mark.parametrize("last", [150, 100, 300], ids=["mid-epoch", "epoch-boundary", "last-planned-step"])
def test_the_badge_and_the_stall_finding_agree_through_a_hang(last):
    msgs, last_t = hang_after(last)
    clock = [last_t]
    monitor = Monitor(lambda: clock[0])
    state, feed = monitor.state, monitor.feed
    seen = set()
    i = 0
    for dt in range(0, 600, 3):  # a viewer evaluating about once a second, checked every 3 s
        now = last_t + dt + 0.25
        clock[0] = now
        while i < len(msgs) and getattr(msgs[i], "t", 0.0) <= now:
            monitor.take(msgs[i])
            i += 1
        feed.evaluate(state, now)
        snap = state.snapshot(now)
        stall = [f for f in snap.findings if f.rule == "stall" and f.evidence.get("ongoing")]
        assert (snap.status == "stalled") == bool(stall), (dt, snap.status, stall)
        assert snap.status in ("running", "stalled"), snap.status
        seen.add(snap.status)
        if snap.status == "stalled":
            assert snap.steps_per_s == 0.0 and snap.eta_s is None  # no step for a minute or more
            assert snap.examples_per_s in (0.0, None)
        else:
            assert snap.steps_per_s == pytest.approx(20, rel=0.05)
    if last != 300:  # after the last planned step the script is finishing, not stalled
        assert seen == {"running", "stalled"}


def test_a_step_after_the_hang_ends_the_stall_at_once():
    msgs, last_t = hang_after(150)
    msgs = msgs[:-1000]  # the hang lasts ~100 s
    clock = [last_t + 100]
    monitor = Monitor(lambda: clock[0])
    state, feed = monitor.state, monitor.feed
    for m in msgs:
        monitor.take(m)
    feed.evaluate(state, clock[0])
    assert state.snapshot().status == "stalled"
    # The next step arrives; the findings are evaluated again only a second later.
    monitor.take(step(151, clock[0] + 0.1))
    clock[0] += 0.2
    assert state.snapshot().status == "running"


def test_a_process_that_went_silent_altogether_is_stalled():
    # Samples stopped too (the process is stopped or frozen): the stall rule measures on the
    # agent's clock and cannot see it; the badge does, and the Findings panel says why.
    msgs, last_t = hang_after(150)
    msgs = msgs[:-1190]  # samples for 5 s after the last step, then nothing
    clock = [last_t + 5]
    monitor = Monitor(lambda: clock[0])
    state, feed = monitor.state, monitor.feed
    for m in msgs:
        monitor.take(m)
    for dt, status in ((30, "running"), (64, "running"), (66, "stalled"), (600, "stalled")):
        clock[0] = last_t + dt
        feed.evaluate(state, clock[0])
        snap = state.snapshot()
        assert snap.status == status, (dt, snap.status)
    assert snap.steps_per_s == 0.0

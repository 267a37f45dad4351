"""The summary stream's folding (tpuwatch.agent.summary): a summary's figures are the records'
own, losses keep the step they belong to, every other line goes on as recorded, and the offsets a
viewer derives from what it receives are the recording's."""

from __future__ import annotations

import statistics

from tpuwatch import protocol
from tpuwatch.agent.summary import SummaryBuilder
from tpuwatch.protocol import DeviceSample, Event, HostSample, HostSummary, Phase, Step, StepLoss


def _lines(msgs):
    return [protocol.encode(m) for m in msgs]


def _viewer_offset(start: int, sent: list[bytes]) -> int:
    """What RemoteSource does: a summary says the offset, any other line adds its length."""
    offset = start
    for line in sent:
        msg = protocol.decode(line)
        offset = msg.offset_bytes if isinstance(msg, HostSummary) else offset + len(line)
    return offset


def test_a_summary_carries_the_records_figures_and_the_losses_with_their_step():
    steps = [Step(step=i, t=100.0 + i * 0.1, step_time_s=0.1 + 0.01 * (i % 3), input_wait_s=0.02 * (i % 2),
                  loss=None if i == 9 else 2.0 - 0.01 * i, replica_losses=() if i == 9 else (2.0 - 0.01 * i,) * 2)
             for i in range(1, 10)]
    extra = [HostSample(t=100.5, rss_bytes=5 << 30, available_bytes=1 << 40, total_bytes=2 << 40, cpu_percent=90.0),
             HostSample(t=100.75, rss_bytes=6 << 30, available_bytes=1 << 40, total_bytes=2 << 40, cpu_percent=95.0),
             DeviceSample(t=100.5, device="TPU:0", current_bytes=1 << 30, peak_bytes=2 << 30, limit_bytes=32 << 30,
                          source="tpu-info"),
             DeviceSample(t=100.75, device="TPU:0", current_bytes=3 << 30, peak_bytes=3 << 30, limit_bytes=32 << 30,
                          source="tpu-info")]
    b = SummaryBuilder(0, clock=lambda: 200.0)
    sent = []
    for line in _lines(steps + extra):
        sent += b.feed(line)
    assert sent == []  # all folded
    sent += b.tick()
    (s,) = [protocol.decode(x) for x in sent]
    times = sorted(m.step_time_s for m in steps)
    assert (s.records, s.steps, s.step, s.step_t) == (9, 9, 9, steps[-1].t)
    assert s.step_time_p50_s == statistics.median(times) and s.step_time_max_s == max(times)
    assert abs(s.step_time_sum_s - sum(times)) < 1e-12
    assert abs(s.input_wait_sum_s - sum(m.input_wait_s for m in steps)) < 1e-12 and s.input_wait_steps == 9
    # step 9 read no loss: the newest losses are step 8's, and say so
    assert (s.loss_step, s.loss, s.replica_losses) == (8, steps[7].loss, steps[7].replica_losses)
    assert s.host_sample() == extra[1] and s.device_samples() == (extra[3],)
    assert s.offset_bytes == sum(map(len, _lines(steps + extra)))

    # the last step's losses read late (StepLoss) belong to step 9 and come in the next summary
    late = StepLoss(t=101.0, step=9, loss=1.5, replica_losses=(1.5, 1.5))
    assert b.feed(protocol.encode(late)) == []
    (s2,) = [protocol.decode(x) for x in b.tick()]
    assert (s2.loss_step, s2.loss, s2.records, s2.step) == (9, 1.5, 0, None)
    assert b.tick() == []  # nothing new: nothing sent


def test_other_lines_go_on_as_recorded_and_offsets_stay_exact():
    recorded = [Step(step=1, t=1.0, step_time_s=0.1, input_wait_s=None, loss=1.0),
                Event(t=1.1, level="warning", source="probe", message="x"),
                Event(t=1.2, level="info", source="probe", message="y"),
                Step(step=2, t=1.3, step_time_s=0.1, input_wait_s=None, loss=1.0),
                Phase(t=1.4, phase="evaluating", since=1.4, detail="test_step", calls=1),
                Phase(t=1.5, phase="evaluating", since=1.4, detail="test_step", calls=2),
                Step(step=3, t=1.6, step_time_s=0.1, input_wait_s=None, loss=1.0)]
    lines = _lines(recorded)
    start = 4096  # attached at some offset
    b = SummaryBuilder(start, clock=lambda: 0.0)
    sent: list[bytes] = []
    for line in lines:
        sent += b.feed(line)
        # after every batch the viewer's offset is at most the builder's, and lines passed on are verbatim
        assert _viewer_offset(start, sent) <= start + sum(map(len, lines[: lines.index(line) + 1]))
    sent += b.tick()
    assert _viewer_offset(start, sent) == start + sum(map(len, lines))
    kinds = [protocol.decode(x).kind for x in sent]
    # a summary before each line passed on; the phase's progress (same since, within the interval) is folded
    assert kinds == ["host_summary", "event", "event", "host_summary", "phase", "host_summary"]
    assert lines[1] in sent and lines[2] in sent and lines[4] in sent and lines[5] not in sent


def test_bytes_of_a_line_too_long_to_send_still_count_in_the_offset():
    b = SummaryBuilder(0, clock=lambda: 0.0)
    line = protocol.encode(Step(step=1, t=1.0, step_time_s=0.1, input_wait_s=None, loss=1.0))
    b.feed(line)
    b.skip(5000)  # the transport dropped a runaway line's bytes
    (s,) = [protocol.decode(x) for x in b.tick()]
    assert s.offset_bytes == len(line) + 5000

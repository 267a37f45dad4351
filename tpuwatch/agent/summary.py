"""The summary stream: a host's recording folded for a viewer of many hosts.

A viewer attached to a pod cannot take every host's records (1,024 hosts x 10 steps a second
x 5 samples). It asks each agent for summaries (:attr:`tpuwatch.protocol.Attach.summary`); the
agent's stream thread (never the training thread) reads the recording as for any viewer and hands
each line to a :class:`SummaryBuilder`, which folds step records, late losses and memory samples
into one :class:`~tpuwatch.protocol.HostSummary` per interval and passes every other line on as it
was recorded (hello, topology, events, findings, results, exit, a new phase). A phase re-sent only
for its progress (an evaluation's calls) is passed on at most once an interval.

Offsets: before any line it passes on, the builder sends a summary (possibly of nothing) whose
``offset_bytes`` is that line's start, so the viewer always knows the byte offset it has
accounted for and can re-attach from it (summaries or the full stream) losing and repeating
nothing. Nothing here imports TensorFlow.
"""

from __future__ import annotations

from typing import Callable, TypeVar

from tpuwatch import protocol
from tpuwatch.figures import quantile
from tpuwatch.protocol import DeviceSample, HostSample, HostSummary, Phase, Step, StepLoss

#: Seconds between two summaries of one host.
SUMMARY_INTERVAL_S = 1.0
#: How often a summary stream that has read everything looks for new lines (a full stream: 50 ms).
SUMMARY_POLL_S = 0.25

_M = TypeVar("_M", HostSample, DeviceSample)

# Kinds folded into a summary (the prefix every encoded line of theirs starts with: ``kind`` is
# written first). Anything else is passed on without decoding.
_FOLDED = tuple(f'{{"kind":"{k}"'.encode() for k in ("step", "step_loss", "host_sample", "device_sample", "phase"))
_HOST = b'{"kind":"host_sample"'
_DEVICE = b'{"kind":"device_sample"'


class SummaryBuilder:
    """Folds one viewer's stream of recorded lines; ``feed`` returns the lines to send.

    ``offset`` is the byte offset of the first line fed (where the viewer attached).
    """

    def __init__(self, offset: int, clock: Callable[[], float]) -> None:
        self.offset = offset  # the byte offset after the last line fed
        self.reported = offset  # the offset the viewer has accounted for
        self._clock = clock
        self._reset()
        self._losses: Step | StepLoss | None = None  # newest losses read, not yet sent
        self._last_step: Step | None = None
        self._phase_key: tuple[str, float] | None = None
        self._phase_sent = float("-inf")  # clock time the current phase last went on

    def _reset(self) -> None:
        self._times: list[float] = []
        self._waits: list[float] = []
        self._steps = 0
        self._time_sum = 0.0
        self._wait_sum = 0.0
        self._wait_steps = 0
        self._host: bytes | None = None  # the newest host sample's line
        self._devices: dict[bytes, bytes] = {}  # the newest line of each device

    def feed(self, line: bytes) -> list[bytes]:
        """Takes one whole recorded line (with its newline); returns what to send now."""
        start = self.offset
        self.offset += len(line)
        if not line.startswith(_FOLDED):
            # passed on as recorded, after a summary that accounts for everything before it
            return self._pass(start, line)
        # Samples: only each one's newest is sent, so only that one is decoded (at the summary).
        if line.startswith(_HOST):
            self._host = line
            return []
        if line.startswith(_DEVICE):
            at = line.find(b'"device":"')
            self._devices[line[at:line.find(b'"', at + 10)] if at >= 0 else b""] = line
            return []
        try:
            msg = protocol.decode(line)
        except protocol.ProtocolError:
            msg = None
        if type(msg) is Step:
            self._step(msg)
        elif type(msg) is StepLoss:
            if self._last_step is not None and msg.step == self._last_step.step and (
                    self._losses is None or self._losses.step <= msg.step):
                self._losses = msg
        elif type(msg) is Phase:
            key = (msg.phase, msg.since)
            now = self._clock()
            # a new phase is news: it goes at once; its progress at most once an interval
            if key != self._phase_key or now - self._phase_sent >= SUMMARY_INTERVAL_S:
                self._phase_key = key
                self._phase_sent = now
                return self._pass(start, line)
        return []

    def skip(self, n: int) -> None:
        """``n`` bytes of the recording that are not sent (part of a line too long to take)."""
        self.offset += n

    def _pass(self, start: int, line: bytes) -> list[bytes]:
        """``line`` as recorded, after a summary that accounts for everything before it."""
        out = [*self._flush(start, force=self.reported != start), line]
        self.reported = self.offset
        return out

    def _step(self, m: Step) -> None:
        k = m.steps if m.steps > 0 else 1
        self._last_step = m
        st = m.step_time_s
        if st == st:  # not NaN
            self._times.append(st)
            self._time_sum += st * k
        self._steps += k
        wait = m.input_wait_s
        if wait is not None and wait == wait:
            self._waits.append(wait)
            self._wait_sum += wait * k
            self._wait_steps += k
        if m.replica_losses or m.loss is not None:
            self._losses = m

    def tick(self) -> list[bytes]:
        """At each interval (and when the stream has read to the end of the recording for the
        first time): the summary of what was folded since the last one, if anything was."""
        return self._flush(self.offset, force=False)

    def _flush(self, offset: int, *, force: bool) -> list[bytes]:
        if not (force or self._steps or self._host or self._devices or self._losses is not None):
            return []
        out = [protocol.encode(self._summary(offset))]
        self.reported = offset
        self._reset()
        self._losses = None
        return out

    def _summary(self, offset: int) -> HostSummary:
        times = sorted(self._times)
        waits = sorted(self._waits)
        last = self._last_step if self._steps else None
        losses = self._losses
        host = _decoded(self._host, HostSample)
        devs = [d for d in (_decoded(line, DeviceSample) for line in self._devices.values()) if d is not None]
        return HostSummary(
            t=self._clock(), offset_bytes=offset, records=len(times), steps=self._steps,
            step=last.step if last else None, step_t=last.t if last else None,
            function=last.function if last else "", epoch=last.epoch if last else None,
            step_time_p50_s=quantile(times, 0.5) if times else None,
            step_time_p95_s=quantile(times, 0.95) if times else None,
            step_time_max_s=times[-1] if times else None,
            step_time_sum_s=self._time_sum, input_wait_sum_s=self._wait_sum, input_wait_steps=self._wait_steps,
            input_wait_p50_s=quantile(waits, 0.5) if waits else None,
            loss=losses.loss if losses else None, replica_losses=losses.replica_losses if losses else (),
            loss_step=losses.step if losses else None,
            host_t=host.t if host else None, rss_bytes=host.rss_bytes if host else None,
            available_bytes=host.available_bytes if host else None, total_bytes=host.total_bytes if host else None,
            cpu_percent=host.cpu_percent if host else None, load_1m=host.load_1m if host else None,
            devices=tuple(d.device for d in devs), device_t=tuple(d.t for d in devs),
            device_current_bytes=tuple(d.current_bytes for d in devs),
            device_peak_bytes=tuple(d.peak_bytes for d in devs),
            device_limit_bytes=tuple(d.limit_bytes or 0 for d in devs),
            device_source=devs[0].source if devs else "", device_limit_source=devs[0].limit_source if devs else "",
        )


def _decoded(line: bytes | None, cls: type[_M]) -> _M | None:
    if line is None:
        return None
    try:
        msg = protocol.decode(line)
    except protocol.ProtocolError:
        return None  # a malformed sample: as if there were none
    return msg if type(msg) is cls else None

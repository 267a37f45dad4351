"""tf.data's own iterator events in a profile capture: each iterator's self time.

tf.data marks every ``GetNext`` of every iterator with a TraceMe named after its chain from the
root, ``Iterator::Root::Prefetch::MapAndBatch::ShuffleAndRepeat::TensorSlice`` (the names are
those of the pipeline *after* tf.data's graph rewrites: a ``map`` and its ``batch`` run fused as
``MapAndBatch``, ``shuffle().repeat()`` as ``ShuffleAndRepeat``, and a ``prefetch`` TF injected
appears though the script wrote none). The events of one thread form one line of the capture's
host plane (``/host:CPU``); the consumer's fetches are on the line of the step's ``IteratorGetNext``,
an asynchronous stage's input runs on its own threads' lines.

Self time = an event's duration minus that of the iterator events nested in it on the same line
(its direct children): a sequential stage's own work plus, for an asynchronous one (``Prefetch``,
``ParallelMapV2``, ``MapAndBatch``), its wait for its own threads. Measured on a capture of a
sequential ``numpy_function`` map (TF 2.21, 20 steps): ``MapAndBatch`` 1,431 ms of self time,
``ShuffleAndRepeat`` 6 ms, ``TensorSlice`` 13 ms, ``Prefetch`` 1,400 ms (its consumer waiting).

Reading is bounded: a capture file larger than ``MAX_BYTES`` is not read, and at most
``MAX_EVENTS`` events are looked at. Runs on the agent's thread, never on the training thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "Iterator::"
MAX_BYTES = 64 << 20
MAX_EVENTS = 2_000_000
MAX_ITERATORS = 64


class TraceError(Exception):
    """The capture could not be read (one line, said once as an event)."""


@dataclass(frozen=True)
class IteratorTimes:
    """Per iterator (its chain without ``Iterator::``, ``Root::Prefetch::Map``): self time and calls."""

    names: tuple[str, ...]
    self_s: tuple[float, ...]
    calls: tuple[int, ...]
    busy_s: tuple[float, ...]  # the events' durations (an asynchronous stage's input is busy on other threads)
    root_s: float  # the consumer's time in tf.data (the Root iterators' durations)
    events: int  # iterator events read


def self_times(lines: Iterable[Iterable[tuple[str, int, int]]]) -> IteratorTimes:
    """Self time per iterator from each line's iterator events ``(name, start_ps, duration_ps)``.

    On one line, events nest (a TraceMe ends before its parent does); an event's direct children
    are the iterator events inside it with no other between."""
    self_ps: dict[str, int] = {}
    busy_ps: dict[str, int] = {}
    calls: dict[str, int] = {}
    root_ps = 0
    count = 0
    for line in lines:
        events = sorted(line, key=lambda e: (e[1], -e[2]))
        stack: list[list[Any]] = []  # [name, end_ps, self_ps]
        for name, start, duration in events:
            count += 1
            while stack and stack[-1][1] <= start:
                _close(stack.pop(), self_ps)
            if stack:
                stack[-1][2] -= min(duration, stack[-1][1] - start)
            stack.append([name, start + duration, duration])
            calls[name] = calls.get(name, 0) + 1
            busy_ps[name] = busy_ps.get(name, 0) + duration
            if name == "Root":
                root_ps += duration
        while stack:
            _close(stack.pop(), self_ps)
    ranked = sorted(self_ps, key=lambda n: -self_ps[n])[:MAX_ITERATORS]
    ranked.sort(key=lambda n: (n.count("::"), n))  # the chain's order, root first
    return IteratorTimes(names=tuple(ranked), self_s=tuple(max(0, self_ps[n]) / 1e12 for n in ranked),
                         calls=tuple(calls[n] for n in ranked), busy_s=tuple(busy_ps[n] / 1e12 for n in ranked),
                         root_s=root_ps / 1e12, events=count)


def _close(frame: list[Any], self_ps: dict[str, int]) -> None:
    self_ps[frame[0]] = self_ps.get(frame[0], 0) + frame[2]


def _xplane_pb2() -> Any:
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2  # TF 2.16-2.21
    except ImportError:
        from tensorflow.core.profiler.protobuf import xplane_pb2  # where an older layout has it
    return xplane_pb2


def read(path: Path, max_bytes: int = MAX_BYTES, max_events: int = MAX_EVENTS) -> IteratorTimes:
    """The iterator self times of one ``<host>.xplane.pb``; raises TraceError with one line."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise TraceError(f"cannot read {path}: {e.strerror}") from None
    if size > max_bytes:
        raise TraceError(f"{path} has {size:,} bytes (read up to {max_bytes:,})")
    try:
        xplane_pb2 = _xplane_pb2()
    except ImportError:
        raise TraceError("this TensorFlow has no XPlane reader (xplane_pb2)") from None
    from google.protobuf.message import DecodeError  # protobuf comes with TensorFlow

    space = xplane_pb2.XSpace()
    try:
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
    except OSError as e:
        raise TraceError(f"cannot read {path}: {e.strerror}") from None
    except DecodeError as e:
        raise TraceError(f"cannot parse {path}: {e}") from None
    budget = [max_events]
    return self_times(_lines(space, budget))


def _lines(space: Any, budget: list[int]) -> Iterable[list[tuple[str, int, int]]]:
    for plane in space.planes:
        names = {k: v.name[len(PREFIX):] for k, v in plane.event_metadata.items()
                 if v.name.startswith(PREFIX)}
        if not names:
            continue
        for line in plane.lines:
            if budget[0] <= 0:
                return
            out = []
            for e in line.events:
                budget[0] -= 1
                name = names.get(e.metadata_id)
                if name is not None:
                    out.append((name, e.offset_ps, e.duration_ps))
                if budget[0] <= 0:
                    break
            if out:
                yield out


def find_capture(directory: Path) -> Path | None:
    """The ``*.xplane.pb`` of a capture directory (``plugins/profile/<run>``), None if none."""
    try:
        files = sorted(p for p in Path(directory).iterdir() if p.name.endswith(".xplane.pb"))
    except OSError:
        return None
    return files[0] if files else None

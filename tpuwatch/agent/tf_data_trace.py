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

Reading is bounded: a capture file larger than ``MAX_BYTES`` is not read, at most ``MAX_EVENTS``
events are looked at, and it is done by a child Python (started from the agent's thread, never
the training thread) that loads only TensorFlow's generated proto module, within ``READ_TIMEOUT_S``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "Iterator::"
MAX_BYTES = 64 << 20
MAX_EVENTS = 2_000_000
MAX_ITERATORS = 64
READ_TIMEOUT_S = 60.0


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
        for raw, start, duration in events:
            count += 1
            # an interleave's or flat_map's inputs are numbered per element (``FlatMap[7]``):
            # one stage for the ranking and the sums, whatever element it read
            name = _plain(raw) if "[" in raw else raw
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


def _plain(name: str) -> str:
    """``Root::Interleave[0]::Map`` -> ``Root::Interleave::Map``."""
    return "::".join(part.split("[", 1)[0] for part in name.split("::"))


def _close(frame: list[Any], self_ps: dict[str, int]) -> None:
    self_ps[frame[0]] = self_ps.get(frame[0], 0) + frame[2]


def xplane_pb2_path() -> str:
    """The file of TensorFlow's generated XPlane proto module (``xplane_pb2.py``), found from the
    ``tensorflow`` package this process imported (never importing it); raises ImportError."""
    tf = sys.modules.get("tensorflow")
    root = os.path.dirname(getattr(tf, "__file__", "") or "")
    for rel in (("tsl", "profiler", "protobuf"), ("core", "profiler", "protobuf")):  # TF 2.16-2.21, older
        path = os.path.join(root, *rel, "xplane_pb2.py")
        if root and os.path.isfile(path):
            return path
    raise ImportError("this TensorFlow has no XPlane reader (xplane_pb2.py)")


def _protobuf_root() -> str:
    """The folder holding the ``google.protobuf`` this process imported ("" if none yet)."""
    module = sys.modules.get("google.protobuf")
    where = getattr(module, "__file__", None)
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(where)))) if where else ""


def _load_module(path: str) -> Any:
    """The generated module from its file alone: it needs only protobuf, not TensorFlow."""
    spec = importlib.util.spec_from_file_location("tpuwatch_xplane_pb2", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read(path: Path, max_bytes: int = MAX_BYTES, max_events: int = MAX_EVENTS,
         timeout_s: float = READ_TIMEOUT_S) -> IteratorTimes:
    """The iterator self times of one ``<host>.xplane.pb``, read by a child Python that loads
    only the proto module (no TensorFlow): reading a capture in the training process held the
    GIL against the training thread (247k events took 9 s there and made the steps 5x slower; the
    child takes 0.3 s). Raises TraceError with one line."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise TraceError(f"cannot read {path}: {e.strerror}") from None
    if size > max_bytes:
        raise TraceError(f"{path} has {size:,} bytes (read up to {max_bytes:,})")
    try:
        proto = xplane_pb2_path()
    except ImportError as e:
        raise TraceError(str(e)) from None
    # -I keeps the script's directory, PYTHONPATH and the user's site out of the child, so the
    # folder this process found protobuf in (a --user install, a venv) goes first on its path
    code = ("import runpy, sys; sys.path.insert(0, sys.argv.pop()); sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    try:
        child = subprocess.run([sys.executable, "-I", "-c", code, os.path.abspath(__file__), str(path), proto,
                                str(max_events), _protobuf_root()], capture_output=True, text=True,
                               timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise TraceError(f"reading {path} took over {timeout_s:g} s") from None
    except OSError as e:
        raise TraceError(f"cannot start {sys.executable} to read {path}: {e.strerror}") from None
    if child.returncode != 0:
        last = (child.stderr.strip().splitlines() or [f"exit code {child.returncode}"])[-1]
        raise TraceError(f"cannot parse {path}: {last[:200]}")
    try:
        d = json.loads(child.stdout)
        return IteratorTimes(names=tuple(d["names"]), self_s=tuple(d["self_s"]), calls=tuple(d["calls"]),
                             busy_s=tuple(d["busy_s"]), root_s=d["root_s"], events=d["events"])
    except (ValueError, KeyError, TypeError) as e:
        raise TraceError(f"unreadable answer reading {path}: {e}") from None


def _read_here(path: str, proto: str, max_events: int) -> IteratorTimes:
    xplane_pb2 = _load_module(proto)
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    return self_times(_lines(space, [max_events]))


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


def _main(argv: list[str]) -> int:
    """The child: ``tf_data_trace.py XPLANE_PB PROTO_MODULE MAX_EVENTS`` prints the times as JSON."""
    try:
        t = _read_here(argv[1], argv[2], int(argv[3]))
    except Exception as e:  # one line for the parent, which says it once as an event
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"names": t.names, "self_s": t.self_s, "calls": t.calls, "busy_s": t.busy_s,
                      "root_s": t.root_s, "events": t.events}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))

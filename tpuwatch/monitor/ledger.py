"""The goodput ledger: every second of a run's wall time, launch to exit, in one bucket.

A :class:`Ledger` is a pure function of a run's messages (a recording, or what a viewer has
received so far): :func:`ledger_of` over a list, or a :class:`LedgerBuilder` per worker fed
message by message (O(1) per step record; :meth:`LedgerBuilder.ledger` is O(distinct step-time
bins)). Nothing here reads a clock: a live ledger is taken up to the latest message time, or a
``now`` the caller gives.

Buckets (seconds), in :data:`BUCKETS` order:

- ``starting``: launch (the process's creation, from the agent's first ``Phase``; else its
  ``Hello``) to the first step call, less evaluations and saves in between;
- ``compiling``: the step calls that traced a function (a ``Retrace`` inside the call), less
  their measured input wait and an ideal step each; traces outside steps belong to the phase
  they happen in;
- ``training``: productive step time, ideal step x steps;
- ``above_ideal``: step time above the ideal (jitter, slow steps, contention), input wait excluded;
- ``input_wait``: the step records' ``input_wait_s``; a record without one (the agent reads the
  in-graph wait at most every 0.25 s of training, less often where a read is costly, and spreads
  each read over the steps since the
  last) is booked at the wait per step of the next record that has one (the read covering it), or
  of the latest one while none has come yet;
- ``evaluating``, ``checkpointing``, ``iterator`` (a new iterator over a distributed dataset):
  the agent's phases between steps;
- ``teardown``: TensorFlow deleting a tf.data iterator (the agent's ``Teardown``: at least 2 s,
  no step call under way), taken out of the stretch between steps it falls in (host between
  steps, evaluating, checkpointing, new iterator, starting, finishing); never *stalled*;
- ``host``: the rest of the time between two steps (callbacks, logging, the script's Python),
  and after the last step until the script's main returns (the agent's ``finishing`` phase);
- ``stalled``: host time inside the stall episodes the caller gives (the ``stall`` rule's);
- ``finishing``: from the script's return to the exit (without the agent's ``finishing`` phase:
  everything after the last step outside evaluations and saves);
- ``unaccounted``: wall time less all of the above (overlaps of measured intervals; ~0).

The *ideal step* is ml-goodput-measurement's: the mean of the step times at or below
median + 3 x MAD, here over each step's compute time (step time less its input wait, so input
wait is its own bucket), weighted by the steps each record covers. Step times are kept in
log-spaced bins 0.5% wide, so it works for microsecond and minute steps alike.
*Goodput* = ``training`` / wall time.

Merged over workers, each bucket (and the wall time) is the workers' mean: every worker of a
synchronous job lives through the same wall time.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Generic, Iterable, Iterator, Mapping, Sequence, TypeVar

from tpuwatch.protocol import Exit, Hello, Message, Phase, Retrace, Step, Teardown

#: Bucket names in the order they are shown.
BUCKETS: tuple[str, ...] = (
    "starting", "compiling", "training", "above_ideal", "input_wait", "evaluating", "checkpointing",
    "iterator", "teardown", "host", "stalled", "finishing", "unaccounted",
)

#: What each bucket is called on screen.
LABELS: Mapping[str, str] = {
    "starting": "starting", "compiling": "compiling", "training": "training (ideal)",
    "above_ideal": "step above ideal", "input_wait": "input wait", "evaluating": "evaluating",
    "checkpointing": "checkpointing", "iterator": "new iterator", "teardown": "iterator teardown",
    "host": "host between steps",
    "stalled": "stalled", "finishing": "finishing", "unaccounted": "unaccounted",
}

#: The diagnostics rule that explains a bucket, when one does.
RULE_OF: Mapping[str, str] = {
    "input_wait": "input-bound", "compiling": "retrace-storm", "stalled": "stall",
    "above_ideal": "step-time-jitter", "host": "host-bound",
}

_BIN = math.log(1.005)
#: Host gaps longer than this are kept (bounded) to be split against stall episodes.
_LONG_GAP_S = 5.0
_MAX_LONG_GAPS = 1000
_MAX_TRACED = 10000
_MAX_TEARDOWNS = 1000


@dataclass(frozen=True)
class TeardownNote:
    """One of TensorFlow's iterator teardowns the ledger booked (the agent's ``Teardown``)."""

    seconds: float  # booked as *iterator teardown*
    since: float  # unix time it began
    cpu_share: float  # the process's CPU seconds over its wall seconds (all threads)
    iterator: str
    step: int
    after_last: bool  # after the run's last step (the last epoch's end, the script's), the run ended
    stack: tuple[str, ...]
    worker: str = ""
    site: str = ""  # the script's innermost line in the stack
    under_way: bool = False  # live: not ended at the latest message


@dataclass(frozen=True)
class Ledger:
    """Where a run's wall time went. ``buckets``: seconds per name in :data:`BUCKETS`."""

    wall_s: float
    buckets: Mapping[str, float]
    ideal_step_s: float | None  # compute time of an ideal step (None: no step yet)
    steps: int
    goodput: float | None  # training / wall (None when the wall time is 0)
    ended: bool  # the run exited (else the ledger runs to the latest message)
    workers: int = 1
    per_worker: tuple[tuple[str, "Ledger"], ...] = field(default=())
    #: Of ``host``, the seconds after the last step (the script's Python until its main returns;
    #: live, the time since the last step): not time *between* steps.
    host_after_last_s: float = 0.0
    #: The iterator teardowns booked, in time order.
    teardowns: tuple[TeardownNote, ...] = ()

    def share(self, bucket: str) -> float:
        return self.buckets.get(bucket, 0.0) / self.wall_s if self.wall_s > 0 else 0.0


_Held = TypeVar("_Held")


class UnreadWaits(Generic[_Held]):
    """Step records that came without their input wait, per step function: the agent reads the
    in-graph wait at most every 0.25 s (or less often) and spreads each read over the steps since the last, so a
    record without one counts at the wait per step of the next read of its own function. The one
    rule for every figure of input wait (the ledger's bucket and the ``input-bound`` finding's
    totals). Bounded: past ``limit`` records held, a record counts at its function's latest
    read, as do those a run's last read has not covered; a function never read has no wait
    (None: the ledger books none, the finding's share leaves it out: "not measured")."""

    __slots__ = ("_held", "_n", "_last", "limit")

    def __init__(self, limit: int = 4096) -> None:
        self._held: dict[str, list[_Held]] = {}
        self._n = 0
        self._last: dict[str, float] = {}
        self.limit = limit

    def __bool__(self) -> bool:
        return self._n > 0

    def hold(self, function: str, record: _Held) -> bool:
        """A record without its wait: True when it is held for the next read; False past the
        bound, when it counts now at :meth:`latest`."""
        if self._n < self.limit:
            self._held.setdefault(function, []).append(record)
            self._n += 1
            return True
        return False

    def latest(self, function: str) -> float | None:
        """The wait per step of ``function``'s latest read (None before any)."""
        return self._last.get(function)

    def release(self, function: str, wait_per_step: float) -> list[_Held]:
        """A record of ``function`` with its wait: the records held for this read, which count at
        ``wait_per_step`` (the record itself is the caller's)."""
        self._last[function] = wait_per_step
        held = self._held.pop(function, None)
        if not held:
            return []
        self._n -= len(held)
        return held

    def pending(self, never_read: bool = True) -> Iterator[tuple[_Held, float | None]]:
        """The records still held, each with its function's latest read wait: where a run that
        ended, or a live view now, counts them. ``never_read=False`` leaves out the functions
        with no read (no wait to count them at: a run without tf.data holds ``limit`` of them)."""
        for function, held in self._held.items():
            wait = self._last.get(function)
            if wait is None and not never_read:
                continue
            for record in held:
                yield record, wait


class _Pause:
    """An iterator teardown the agent timed, and how much of it the ledger booked so far."""

    __slots__ = ("msg", "booked")

    def __init__(self, msg: Teardown, booked: float = 0.0) -> None:
        self.msg = msg
        self.booked = booked


class LedgerBuilder:
    """One worker's ledger, built incrementally from its messages in order."""

    def __init__(self) -> None:
        self.launch_t: float | None = None
        self.exit_t: float | None = None
        self.last_t: float | None = None
        self.booked = dict.fromkeys(BUCKETS, 0.0)
        self._bins: dict[int, list[float]] = {}  # bin -> [steps, compute seconds]
        self.steps = 0
        self._plain_steps = 0
        self._plain_time = 0.0  # step time (compute + wait) of records that traced nothing
        self._wait = 0.0
        # records without their input wait: (step time x steps, steps)
        self._unread: UnreadWaits[tuple[float, int]] = UnreadWaits()
        self._traced: list[tuple[float, int]] = []  # (step time x steps, steps) of tracing records
        self._retraces: list[float] = []  # times of traces since the last step record
        self._phase = "starting"  # the agent's phase at _cursor
        self._phases: list[tuple[float, str]] = []  # phase changes after _cursor
        self._cursor: float | None = None  # end of the last step record
        # long stretches between steps (start, end, bucket), to split by stall episodes
        self._long_gaps: list[tuple[float, float, str]] = []
        # the agent said the script returned (its "finishing" phase): until then, the time after
        # the last step is host; a recording without it books all of it as finishing
        self._finish_seen = False
        # the agent's Teardowns in time order; the first _pause_i of them end before the stretch
        # booked last
        self._pauses: list[_Pause] = []
        self._pause_i = 0
        self._pause_pieces: list[tuple[float, float]] = []  # what was booked as teardown (for stalls)

    def apply(self, msg: Message) -> None:
        t = getattr(msg, "t", None)
        if type(msg) is Step:
            self._step(msg)
        elif type(msg) is Phase:
            if self.launch_t is None or (msg.phase == "starting" and msg.since < self.launch_t):
                self.launch_t = msg.since
            if msg.phase == "finishing":
                self._finish_seen = True
            if msg.phase != "training" and (not self._phases or self._phases[-1] != (msg.since, msg.phase)):
                self._phases.append((msg.since, msg.phase))
        elif type(msg) is Teardown:
            last = self._pauses[-1] if self._pauses else None
            if last is not None and last.msg.since == msg.since:
                if msg.t > last.msg.t:  # the same teardown, further on (or ended)
                    last.msg = msg
            elif len(self._pauses) < _MAX_TEARDOWNS and msg.t > msg.since:
                self._pauses.append(_Pause(msg))
        elif type(msg) is Retrace:
            if len(self._retraces) < 100:
                self._retraces.append(msg.t)
        elif type(msg) is Hello:
            if self.launch_t is None:
                self.launch_t = msg.t
        elif type(msg) is Exit:
            if self.exit_t is None or msg.source == "agent":
                self.exit_t = msg.t
        if isinstance(t, (int, float)):
            if self.launch_t is None:
                self.launch_t = float(t)
            if self.last_t is None or t > self.last_t:
                self.last_t = float(t)

    def _step(self, msg: Step) -> None:
        n = max(1, msg.steps)
        total = msg.step_time_s * n
        start = msg.t - total
        if self.launch_t is None:
            self.launch_t = start
        cursor = self._cursor
        if cursor is not None and not self._phases and self._phase in ("training", "host", "starting"):
            # the hot path: a gap between two steps with no phase change in it
            if start > cursor:
                self._book(self._phase, cursor, start, between_steps=True)
        else:
            self._book_until(start, between_steps=cursor is not None)
        self._cursor = msg.t if msg.t > start else start
        traced = False
        if self._retraces:
            traced = any(start <= rt <= msg.t for rt in self._retraces)
            self._retraces.clear()
        self.steps += n
        if traced and len(self._traced) < _MAX_TRACED:
            # its measured wait is input wait all the same (a first batch waiting for a shuffle
            # buffer to fill); the rest of the call, less an ideal step, is compiling
            wait = min(max((msg.input_wait_s or 0.0) * n, 0.0), total)
            self._wait += wait
            self._traced.append((total - wait, n))
            return
        self._plain_time += total
        self._plain_steps += n
        per_step = msg.input_wait_s
        fn = msg.function
        if per_step is None:
            if not self._unread.hold(fn, (total, n)):
                self._add(total, n, self._unread.latest(fn) or 0.0)
            return
        for t_u, n_u in self._unread.release(fn, per_step):
            self._add(t_u, n_u, per_step)
        self._add(total, n, per_step)

    def _add(self, total: float, n: int, wait_per_step: float) -> None:
        """A plain record's wait and compute time (the ideal step's bins)."""
        wait = min(max(wait_per_step * n, 0.0), total)
        self._wait += wait
        compute = (total - wait) / n
        key = int(math.floor(math.log(compute) / _BIN)) if compute > 0 else -10**6
        b = self._bins.get(key)
        if b is None:
            self._bins[key] = [float(n), compute * n]
        else:
            b[0] += n
            b[1] += compute * n

    def _book_until(self, end: float, *, between_steps: bool) -> None:
        """Books [cursor, end] by the agent's phases (before the first step: from launch)."""
        t = self._cursor if self._cursor is not None else self.launch_t
        if t is None:
            return
        changes = self._phases
        i = 0
        phase = self._phase
        while True:
            while i < len(changes) and changes[i][0] <= t:
                phase = changes[i][1]
                i += 1
            nxt = changes[i][0] if i < len(changes) else end
            seg_end = min(nxt, end)
            if seg_end > t:
                self._book(phase, t, seg_end, between_steps=between_steps)
                t = seg_end
            if seg_end >= end:
                break
        # keep the phase in force at ``end`` and the changes after it
        while i < len(changes) and changes[i][0] <= end:
            phase = changes[i][1]
            i += 1
        self._phase = phase
        del changes[:i]

    def _book(self, phase: str, start: float, end: float, *, between_steps: bool) -> None:
        seconds = end - start
        if between_steps and phase in ("training", "host", "starting") and seconds < _LONG_GAP_S:
            if self._pause_i < len(self._pauses):
                seconds -= self._take_pauses(start, end)
            self.booked["host"] += seconds  # the usual gap between two steps
            return
        if phase in ("evaluating", "checkpointing"):
            bucket = phase
        elif not between_steps and self._cursor is None:
            bucket = "starting"  # before the first step, the rest is starting
        elif phase == "iterator":
            bucket = "iterator"
        elif between_steps or (self._finish_seen and phase != "finishing"):
            bucket = "host"  # after the last step, the script's own Python until its main returns
        else:
            bucket = "finishing"
        if self._pause_i < len(self._pauses):
            self.booked[bucket] += seconds - self._take_pauses(start, end)
        else:
            self.booked[bucket] += seconds
        if self._cursor is not None and seconds >= _LONG_GAP_S and len(self._long_gaps) < _MAX_LONG_GAPS:
            self._long_gaps.append((start, end, bucket))

    def _take_pauses(self, start: float, end: float) -> float:
        """Books the agent's teardowns inside [start, end] as *teardown*; returns their seconds."""
        pauses = self._pauses
        i = self._pause_i
        while i < len(pauses) and pauses[i].msg.t <= start:
            i += 1
        self._pause_i = i
        taken = 0.0
        while i < len(pauses) and pauses[i].msg.since < end:
            p = pauses[i]
            a, b = max(start, p.msg.since), min(end, p.msg.t)
            if b > a:
                taken += b - a
                p.booked += b - a
                if len(self._pause_pieces) < _MAX_TEARDOWNS:
                    self._pause_pieces.append((a, b))
            i += 1
        self.booked["teardown"] += taken
        return taken

    def notes(self) -> list[tuple[float, Teardown]]:
        """(seconds booked, message) of each teardown booked so far."""
        return [(p.booked, p.msg) for p in self._pauses if p.booked > 0]

    def ledger(self, stalls: Sequence[tuple[float, float]] = (), now: float | None = None) -> Ledger:
        """The ledger so far. ``stalls``: (start, end) unix times of the stall episodes (their
        host time between steps is *stalled*); ``now``: the end of a live run's ledger (default
        the latest message time)."""
        start = self.launch_t
        ended = self.exit_t is not None
        end = self.exit_t if ended else (now if now is not None else self.last_t)
        if start is None or end is None:
            return Ledger(0.0, dict.fromkeys(BUCKETS, 0.0), None, 0, None, ended)
        buckets = dict(self.booked)
        # the tail after the last step (or everything, before it), booked on a copy of the state
        tail = _copy(self)
        tail._book_until(max(end, tail._cursor or end), between_steps=False)
        for k in BUCKETS:
            buckets[k] = tail.booked[k]
        long_gaps = tail._long_gaps
        host_after = tail.booked["host"] - self.booked["host"] if self._cursor is not None else 0.0
        if not ended and self._cursor is not None:
            # live: the time since the last step is host time until the run ends
            host_after += buckets["finishing"]
            buckets["host"] += buckets["finishing"]
            buckets["finishing"] = 0.0
            long_gaps = [(s, e, "host" if b == "finishing" else b) for s, e, b in long_gaps]
        # the stall rule's stretches with nothing progressing, between steps or after the last
        # (whatever phase the agent last named: an evaluation whose calls stopped is stalled)
        buckets["stalled"] = 0.0
        for s, e, bucket in long_gaps if stalls else ():
            # a teardown inside it is named, not stalled
            moved = _overlap((s, e), stalls) - sum(_overlap(p, stalls) for p in tail._pause_pieces
                                                   if s <= p[0] and p[1] <= e)
            buckets[bucket] -= moved
            buckets["stalled"] += moved
        # records whose wait's read has not come: at the latest read's wait per step
        tail._bins = {k: list(v) for k, v in self._bins.items()} if self._unread else self._bins
        for (t_u, n_u), wait in self._unread.pending():
            tail._add(t_u, n_u, wait or 0.0)
        ideal = _ideal(tail._bins)
        traced_time = sum(x for x, _ in self._traced)
        traced_steps = sum(n for _, n in self._traced)
        if ideal is None and traced_steps:
            ideal = min(x / n for x, n in self._traced)
        productive = (ideal or 0.0) * (self._plain_steps + traced_steps)
        buckets["compiling"] = max(0.0, traced_time - (ideal or 0.0) * traced_steps)
        buckets["training"] = productive
        buckets["input_wait"] = tail._wait
        buckets["above_ideal"] = max(0.0, self._plain_time - tail._wait - (ideal or 0.0) * self._plain_steps)
        wall = max(0.0, end - start)
        buckets["unaccounted"] = 0.0
        buckets["unaccounted"] = wall - sum(buckets.values())
        last = self._cursor
        teardowns = tuple(TeardownNote(sec, msg.since, msg.cpu_s / (msg.t - msg.since), msg.iterator, msg.step,
                                       ended and last is not None and msg.since >= last, msg.stack, site=msg.site,
                                       under_way=msg.under_way)
                          for sec, msg in tail.notes())
        return Ledger(wall, buckets, ideal, self.steps, productive / wall if wall > 0 else None, ended,
                      host_after_last_s=max(0.0, host_after), teardowns=teardowns)


def _copy(b: LedgerBuilder) -> LedgerBuilder:
    c = LedgerBuilder.__new__(LedgerBuilder)
    c.__dict__.update(b.__dict__)
    c.booked = dict(b.booked)
    c._phases = list(b._phases)
    c._long_gaps = list(b._long_gaps)
    c._pauses = [_Pause(p.msg, p.booked) for p in b._pauses]
    c._pause_pieces = list(b._pause_pieces)
    return c


def _overlap(gap: tuple[float, float], spans: Sequence[tuple[float, float]]) -> float:
    a, b = gap
    return sum(max(0.0, min(b, e) - max(a, s)) for s, e in spans)


def _ideal(bins: Mapping[int, list[float]]) -> float | None:
    """Mean of the per-step compute times at or below median + 3 x MAD (weighted by steps)."""
    if not bins:
        return None
    items = sorted((v[1] / v[0], v[0], v[1]) for v in bins.values())  # (mean time, steps, seconds)
    med = _weighted_median([(x, w) for x, w, _ in items])
    mad = _weighted_median(sorted((abs(x - med), w) for x, w, _ in items))
    limit = med + 3.0 * mad
    steps = sum(w for x, w, _ in items if x <= limit * (1 + 1e-9))
    seconds = sum(s for x, _, s in items if x <= limit * (1 + 1e-9))
    return seconds / steps if steps else med


def _weighted_median(pairs: Sequence[tuple[float, float]]) -> float:
    """The lower weighted median of sorted (value, weight) pairs."""
    half = sum(w for _, w in pairs) / 2.0
    acc = 0.0
    for x, w in pairs:
        acc += w
        if acc >= half:
            return x
    return pairs[-1][0]


def merge(ledgers: Sequence[tuple[str, Ledger]]) -> Ledger | None:
    """The workers' ledgers as one: each bucket, the wall time and the steps are their means."""
    if not ledgers:
        return None
    if len(ledgers) == 1:
        name, only = ledgers[0]
        return Ledger(only.wall_s, only.buckets, only.ideal_step_s, only.steps, only.goodput, only.ended,
                      1, ((name, only),), only.host_after_last_s, only.teardowns)
    k = len(ledgers)
    ls = [lg for _, lg in ledgers]
    wall = sum(lg.wall_s for lg in ls) / k
    buckets = {b: sum(lg.buckets.get(b, 0.0) for lg in ls) / k for b in BUCKETS}
    ideals = [lg.ideal_step_s for lg in ls if lg.ideal_step_s is not None]
    return Ledger(wall, buckets, sum(ideals) / len(ideals) if ideals else None,
                  round(sum(lg.steps for lg in ls) / k), buckets["training"] / wall if wall > 0 else None,
                  all(lg.ended for lg in ls), k, tuple(ledgers), sum(lg.host_after_last_s for lg in ls) / k,
                  tuple(sorted((dataclasses.replace(n, worker=name) for name, lg in ledgers for n in lg.teardowns),
                               key=lambda n: n.since)))


def ledger_of(messages: Iterable[Message | tuple[str, Message]],
              stalls: Mapping[str, Sequence[tuple[float, float]]] | None = None) -> Ledger | None:
    """The merged ledger of a finished recording: ``messages`` in order, each a message (one
    worker, named by its Hello) or a (worker, message) pair. ``stalls``: per worker, its stall
    episodes (start, end)."""
    builders: dict[str, LedgerBuilder] = {}
    current = ""
    for item in messages:
        if isinstance(item, tuple):
            worker, msg = item
        else:
            msg = item
            if isinstance(msg, Hello):
                current = msg.worker
            worker = current
        b = builders.get(worker)
        if b is None:
            b = builders[worker] = LedgerBuilder()
        b.apply(msg)
    stalls = stalls or {}
    return merge([(name, b.ledger(stalls.get(name, ()))) for name, b in builders.items() if b.steps or b.exit_t])


# --- text: one rendering for the headless line, the summary, the report and the panel ----------

@dataclass(frozen=True)
class LedgerRow:
    bucket: str
    label: str
    seconds: float
    share: float  # of the wall time
    rule: str  # the finding that explains it, when one is present ("" otherwise)


def rows(ledger: Ledger, finding_rules: Iterable[str] = (), *, all_buckets: bool = False) -> list[LedgerRow]:
    """The buckets in :data:`BUCKETS` order (those under 0.05% of the wall time left out unless
    ``all_buckets``), each pointing to the finding rule among ``finding_rules`` that explains it."""
    present = set(finding_rules)
    out = []
    for b in BUCKETS:
        seconds = ledger.buckets.get(b, 0.0)
        share = ledger.share(b)
        if not all_buckets and abs(share) < 0.0005:
            continue
        rule = RULE_OF.get(b, "")
        out.append(LedgerRow(b, LABELS[b], seconds, share, rule if rule in present else ""))
    return out


def goodput_line(ledger: Ledger, top: int = 3) -> str:
    """``goodput 62% of 3m07s; host between steps 21%, evaluating 9%, starting 5%``."""
    from tpuwatch.units import fmt_duration

    head = "goodput " + (f"{100 * ledger.goodput:.1f}%" if ledger.goodput is not None else "?")
    head += f" of {fmt_duration(ledger.wall_s)}"
    rest = sorted((r for r in rows(ledger) if r.bucket not in ("training", "unaccounted")),
                  key=lambda r: -r.seconds)[:top]
    if rest:
        head += "; " + ", ".join(f"{r.label} {100 * r.share:.0f}%" for r in rest)
    return head


#: A teardown whose process CPU stays under this share of one core is idle waiting.
IDLE_CPU_SHARE = 0.2


def teardown_lines(notes: Sequence[TeardownNote], top: int = 3, *, short: bool = False) -> list[str]:
    """One line per iterator teardown, the longest first (``top`` of them), saying what it is:
    ``iterator teardown 19.50 s after step 1,200, 0% CPU: TensorFlow deleting a tf.data iterator
    (OwnedIterator) waits for tf.data's threads ...; at train.py:48 in main: for x in ds:``.
    ``short``: for a panel, ``19.50 s after step 1,200, 0% CPU: tf.data iterator deleted at train.py:48``."""
    from tpuwatch.units import duration

    out = []
    for n in sorted(notes, key=lambda n: -n.seconds)[:top]:
        where = f"after step {n.step:,}" + (" (the last)" if n.after_last else "")
        where += ", under way" if n.under_way else ""
        who = f" on {n.worker}" if n.worker else ""
        line_at = n.site or (n.stack[0] if n.stack else "")
        if short:
            at = f" at {line_at.split(' ', 1)[0]}" if line_at else ""
            out.append(f"  {duration(n.seconds)} {where}{who}, {100 * n.cpu_share:.0f}% CPU: "
                       f"tf.data iterator deleted{at}")
            continue
        if n.cpu_share < IDLE_CPU_SHARE:
            what = (f"TensorFlow deleting a tf.data iterator ({n.iterator}) waits, idle, for tf.data's own "
                    "threads to stop (its autotune thread, a prefetch, a map element in flight)")
        else:
            what = f"TensorFlow deleting a tf.data iterator ({n.iterator})"
        line = f"iterator teardown {duration(n.seconds)} {where}{who}, {100 * n.cpu_share:.0f}% CPU: {what}"
        out.append(line + (f"; at {line_at}" if line_at else ""))
    if len(notes) > top:
        out.append(f"and {len(notes) - top} more teardowns, {duration(sum(n.seconds for n in notes))} in all")
    return out


def note_of(d: Mapping[str, object]) -> TeardownNote:
    """A teardown from ``as_dict``'s JSON (the report's text is written from it)."""
    def num(k: str) -> float:
        v = d.get(k)
        return float(v) if isinstance(v, (int, float)) else 0.0

    stack = d.get("stack")
    return TeardownNote(num("seconds"), num("since"), num("cpu_share"), str(d.get("iterator", "")),
                        int(num("step")), bool(d.get("after_last")),
                        tuple(str(x) for x in stack) if isinstance(stack, (list, tuple)) else (),
                        str(d.get("worker", "")), str(d.get("site", "")), bool(d.get("under_way")))


def phase_text(phase: str, since: float | None, now: float) -> str:
    """``evaluating 2:31``: the phase and how long it has lasted."""
    from tpuwatch.units import clock

    if not phase:
        return ""
    return f"{phase} {clock(now - since)}" if since is not None else phase


def as_dict(ledger: Ledger) -> dict[str, object]:
    """Plain JSON for ``report --format json``: seconds and shares per bucket, per worker too."""
    def one(lg: Ledger) -> dict[str, object]:
        return {
            "wall_s": round(lg.wall_s, 6),
            "goodput": None if lg.goodput is None else round(lg.goodput, 6),
            "ideal_step_s": None if lg.ideal_step_s is None else round(lg.ideal_step_s, 9),
            "steps": lg.steps,
            "ended": lg.ended,
            "buckets_s": {b: round(lg.buckets.get(b, 0.0), 6) for b in BUCKETS},
            "host_after_last_s": round(lg.host_after_last_s, 6),
            "teardowns": [{"seconds": round(n.seconds, 6), "since": n.since, "cpu_share": round(n.cpu_share, 4),
                           "iterator": n.iterator, "step": n.step, "after_last": n.after_last,
                           "stack": list(n.stack), "site": n.site, "under_way": n.under_way,
                           **({"worker": n.worker} if n.worker else {})}
                          for n in lg.teardowns],
        }

    out = one(ledger)
    out["workers"] = {name: one(lg) for name, lg in ledger.per_worker} if ledger.workers > 1 else {}
    return out

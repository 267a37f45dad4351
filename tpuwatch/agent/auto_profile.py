"""The auto-profile: when the step begins to wait for input, capture a short profile and measure
which tf.data stage the wait comes from.

Runs on the agent's thread: the Steps each drain writes are tapped (:attr:`Agent.step_taps`, never
on the training thread) into per-sample sums, and at the sample rate the wait over the last
``WINDOW_S`` seconds is judged. An *episode* begins when the wait reaches ``SHARE_FRAC`` of step
time (xprof's "moderately input-bound", the ``input-bound`` rule's info threshold; the rule's own
figure is the one every view quotes, this is only the trigger) and ends when a full window falls
below it. Once per episode (at most ``MAX_CAPTURES`` a run, ``MIN_GAP_S`` apart, never while
another capture runs nor while the leak doctor's window samples (with tracemalloc both slow the
steps; without, the profiler's buffers would grow RSS under the window) or the script runs
tracemalloc itself,
never when the training fetches distributed batches eagerly: that fetch is the wait, whatever
the stages; never when several workers train one job: a capture on one host slows every host's
collectives, and a MultiWorkerMirroredStrategy worker whose script ended inside a capture died by
SIGSEGV as the profiler stopped, once in ten runs here; the pick by settings stands there)
the agent sends itself a ``profile`` command of ``CAPTURE_STEPS`` steps, at most
``CAPTURE_MAX_S``: it runs
through the profiler's own path (queued, started at the next step boundary, stopped and written
on the profiler's helper thread) and is recorded as any profile, with its Result and path. When
the Result is in, the capture's ``*.xplane.pb`` is read here (:mod:`.tf_data_trace`, bounded) and
sent as one :class:`~tpuwatch.protocol.InputStages` with the step time before, inside and after
the capture (its cost). A capture whose steps filled less than ``PAUSED_FRAC`` of it measured
the stages idle: it is not read, and another follows ``RETRY_GAP_S`` later in the same episode.
Any failure is one event; nothing raises into the script.

The same budget serves a second trigger, *slow steps*: when ``SLOW_STEPS`` step calls in a row
each take at least ``SLOW_FACTOR`` x the run's own median (of the step function's steps after
warm-up, learnt from the records, and at least ``SLOW_MIN_EXTRA_S`` more: timer noise on a 1 ms
step is no slowdown; never across a trace: a retrace's slow calls are the retrace finding's), the
agent captures ``CAPTURE_STEPS`` of the slow steps the same way (within the same ``MAX_CAPTURES``;
``MIN_GAP_S`` apart from the previous slowdown's capture, not from an input capture's) and sends one
:class:`~tpuwatch.protocol.SlowSteps`: the capture's path, and what a slow step spent (its time,
input wait and the host time between calls) beside a normal one. Evaluation calls are no steps;
warm-up steps are not judged. The calls inside another capture (and its reading) are held, not
judged (the profiler slows them): slow ones just before the calls of a slowdown are its first, so
a slowdown that begins inside an input capture is dated from its first step; it then cuts that
capture's after-measurement short, so its own capture falls inside it.

The script's own profile wins: TF runs one profiler at a time, so a script (or library) that calls
``tf.profiler.experimental.start`` while an automatic capture runs would get an error. The start is
wrapped: such a call first stops the automatic capture and waits for it (bounded by
``YIELD_WAIT_S``; once, on the thread that starts the profile), then starts the script's. Where the
wrapper cannot be installed, nothing is captured.
"""

from __future__ import annotations

import os
import threading
import time
import tracemalloc
from collections import deque
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from tpuwatch import figures
from tpuwatch.agent import tf_data_trace
from tpuwatch.protocol import AUTO_PROFILE_ID_PREFIX, Command, InputStages, Message, SlowSteps, Step

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.patches import Patches
    from tpuwatch.agent.profiler import Profiler

PROBE = "auto_profile"
SHARE_FRAC = figures.INPUT_INFO_FRAC  # the input-bound rule's "moderately"
MIN_WAIT_S = figures.INPUT_MIN_WAIT_S  # mean wait per step below this is timer noise, as for the rule
WARMUP_STEPS = 20  # the first steps trace and compile
WINDOW_S = 3.0
MIN_STEPS = 8  # steps that measured their wait in the window, to judge it
#: The most steps without a wait of their own that the next wait read is taken to cover (a read
#: that found no fetch since the last one covers none, and nothing says so in its Step)
UNREAD_MAX = 256
UNREAD_FUNCTIONS = 16  # step functions kept track of (a script that makes one a call: the first 16)
_NONE_UNREAD = (0, 0.0)
#: A capture's length: enough steps to sum each stage's time over, and no more: the profiler's
#: buffers grow with the events (1 s of 7 ms CPU steps, 149 of them, took ~450 MB of RSS, which
#: the allocator kept: it hid a leak's growth after it and looked like one itself).
CAPTURE_STEPS = 20
CAPTURE_MAX_S = 1.0
AFTER_S = 2.0  # step time after the capture is taken over this long (or AFTER_STEPS steps)
AFTER_STEPS = 50
MAX_CAPTURES = 3
MIN_GAP_S = 60.0
#: A capture whose steps filled less than half of it (the training stood still: seen once in CI,
#: ~1.1 s between two steps as the capture began) measured the stages waiting, not working:
#: another capture follows this long after, in the same episode (within ``MAX_CAPTURES``).
RETRY_GAP_S = 2.0
PAUSED_FRAC = 0.5
YIELD_WAIT_S = 5.0
MIN_FREE_BYTES = 1 << 30  # an unasked-for capture never takes the run directory's last GiB
READ_WAIT_AT_EXIT_S = 5.0  # at the script's end, how long a read under way may take
#: How a capture of the full length ended (the profiler's ``stopped_by``); one cut short (the
#: script ended, or started a profile of its own) measured too little to name a stage.
FULL_LENGTH = frozenset({"steps", "time", "timer"})

#: Slow steps: this many calls in a row, each at least SLOW_FACTOR x the median and
#: SLOW_MIN_EXTRA_S above it; the median over the newest NORMAL_KEPT normal calls.
SLOW_FACTOR = 3.0
SLOW_STEPS = 5
SLOW_MIN_EXTRA_S = 0.010
NORMAL_KEPT = 101

#: Calls held while another capture (or its reading) slows them, at most.
HELD_MAX = 4 * CAPTURE_STEPS
#: A capture's Result can come before the agent's drain has tapped the steps it held (20 steps of
#: 2 ms take 40 ms; the drains are ~4 a second): its outcome waits for them at most this many
#: samples, its steps kept by number meanwhile, at most ROWS_MAX calls.
OUTCOME_WAITS = 8
ROWS_MAX = 4096
EXIT_TAP_WAIT_S = 0.5  # at the script's end, how long the capture's steps may take to be tapped

_NAMES = [f.name for f in fields(Step)]
_STEP, _T, _TIME, _WAIT, _STEPS, _FN = (_NAMES.index(n) for n in ("step", "t", "step_time_s", "input_wait_s",
                                                                  "steps", "function"))


class _Slow:
    """The slow-steps trigger's state (agent thread; the tap writes, the sampler reads, under the
    profile's lock)."""

    __slots__ = ("normal", "median", "function", "run", "first", "want", "traces", "prev_t", "inside", "before",
                 "run_rows", "held")

    def __init__(self) -> None:
        #: (step time, input wait or None, host time between calls) per normal call, per step
        self.normal: deque[tuple[float, float | None, float]] = deque(maxlen=NORMAL_KEPT)
        self.median: float | None = None  # of the normal calls' step times, at the last sample
        self.function = ""
        self.run = 0  # slow calls in a row
        self.first = 0  # the first step of that run
        self.want = False
        self.traces = -1  # the retrace probe's count at the last sample
        self.prev_t: float | None = None
        self.inside: list[tuple[float, float | None, float]] = []  # the capture's calls
        self.run_rows: deque[tuple[float, float | None, float]] = deque(maxlen=SLOW_STEPS)  # the run's latest
        self.before: tuple[float, float | None, float] | None = None  # normal means when it began
        #: (step, calls' steps, row) of the calls another capture slowed (its own and its reading's),
        #: judged once it is over: slow ones just before a slowdown are its first calls
        self.held: list[tuple[int, int, tuple[float, float | None, float]]] = []

    def means(self, rows: "Iterable[tuple[float, float | None, float]]") -> tuple[float, float | None, float]:
        rows = list(rows)
        waits = [w for _, w, _ in rows if w is not None]
        n = max(1, len(rows))
        return (sum(r[0] for r in rows) / n, sum(waits) / len(waits) if waits else None, sum(r[2] for r in rows) / n)


def _trailing_slow(held: "list[tuple[int, int, tuple[float, float | None, float]]]",
                   med: float) -> "list[tuple[int, int, tuple[float, float | None, float]]]":
    """The held calls at the end of ``held`` that were slow by the trigger's measure, in order."""
    out = []
    for h in reversed(held):
        if not _is_slow(h[2][0], med):
            break
        out.append(h)
    return out[::-1]


def _is_slow(step_time_s: float, med: float) -> bool:
    """A call slow by the trigger's measure against the normal calls' median."""
    return step_time_s >= SLOW_FACTOR * med and step_time_s - med >= SLOW_MIN_EXTRA_S


class _Sums:
    __slots__ = ("steps", "time_s", "measured", "measured_time_s", "wait_s", "first", "last", "last_k",
                 "eager_fetches")

    def __init__(self) -> None:
        self.steps = 0
        self.time_s = 0.0
        self.measured = 0  # steps that measured their wait
        self.measured_time_s = 0.0
        self.wait_s = 0.0
        self.first: int | None = None
        self.last: int | None = None
        self.last_k = 1  # steps in the newest call (steps_per_execution)
        self.eager_fetches = 0  # distributed batches fetched eagerly meanwhile

    def add(self, step: int, step_time_s: float, wait_s: float | None, k: int,
            back: tuple[int, float] = _NONE_UNREAD) -> None:
        """One call of ``k`` steps; ``back``: (steps, their time) of the calls just before it that
        carried no wait, which ``wait_s``, a mean since the last read, covers too."""
        self.steps += k
        self.time_s += step_time_s * k
        if wait_s is not None:
            self.measured += k + back[0]
            self.measured_time_s += step_time_s * k + back[1]
            self.wait_s += wait_s * (k + back[0])
        if self.first is None:
            self.first = step
        self.last = step
        self.last_k = k

    def mean_step_s(self) -> float | None:
        return self.time_s / self.steps if self.steps else None


class AutoProfile:
    def __init__(self, agent: "Agent", profiler: "Profiler", clock: Callable[[], float] = time.monotonic) -> None:
        self.agent = agent
        self.profiler = profiler
        self._clock = clock
        self._lock = threading.Lock()
        self._bucket = _Sums()  # steps tapped since the last sample
        #: step function -> (steps, their time) tapped since its last one that carried its wait:
        #: its next wait read is their mean too (the in-graph wait is read at the read pace, its
        #: sum since the last read)
        self._unread: dict[str, tuple[int, float]] = {}
        self._window: deque[tuple[float, _Sums]] = deque()
        self._fetches = 0  # the step probe's eager distributed fetches at the last sample
        self._episode = False
        self._want = False
        self._captures = 0
        self._last_t = -1e18
        self._said_failure = False
        # one capture in flight: "capturing" until its outcome is taken in (its Result, once the
        # steps it held are tapped), "after" while the step time after it is taken
        self.state = "idle"
        # (step, step time, wait, steps a call) of each call tapped since the capture began, until
        # its outcome sorts them by number into the steps inside it and after it (_phase)
        self._rows: list[tuple[int, float, float | None, int]] = []
        self._capture_last: int | None = None  # the first step of the capture's last call, once known
        self._result_last: int | None = None  # the same, from the Result (set on the profiler's thread)
        self._tapped = 0  # the newest step tapped
        self._waits = 0  # samples the outcome waited for the capture's steps
        self._phase = _Sums()
        self._before: float | None = None
        self._inside: float | None = None
        self._outcome: tuple[bool, str, dict[str, Any]] | None = None
        self._inside_steps = _Sums()
        self._measured: tuple[str, float, int, int, tf_data_trace.IteratorTimes] | None = None
        self._after_t0 = 0.0
        # the capture is read by a thread of its own (a child Python, up to READ_TIMEOUT_S): the
        # agent thread goes on draining and sampling meanwhile
        self._reader: threading.Thread | None = None
        self.probe = PROBE  # the runtime names this probe when a listener fails
        self._slow = _Slow()
        self._last_slow_t = -1e18
        self._kind = "input"  # what the capture in flight is for: "input" or "slow"
        rp = getattr(agent, "retrace_probe", None)
        counts = getattr(rp, "_traces", None)  # the retrace probe's traces per function name
        self._traces: Callable[[], int] = (lambda: sum(counts.values())) if counts is not None else (lambda: 0)

    # --- on the agent thread, per Step written ------------------------------------------------

    def tap(self, f: tuple[Any, ...]) -> None:
        """One Step's fields (see :meth:`tap_all`)."""
        self.tap_all([f])

    def tap_all(self, steps: list[tuple[Any, ...]]) -> None:
        """The Steps' fields written by one drain of the agent's buffer (``Agent.step_taps``)."""
        with self._lock:
            bucket = self._bucket
            track = self.state != "idle" and self._kind == "input"
            rows, phase, last = self._rows, self._phase, self._capture_last
            unread = self._unread
            for f in steps:
                step, step_time_s, wait_s, k = f[_STEP], f[_TIME], f[_WAIT], f[_STEPS]
                if step > WARMUP_STEPS:
                    fn = f[_FN]  # each step function's reads cover its own steps
                    back = unread.get(fn, _NONE_UNREAD)
                    bucket.add(step, step_time_s, wait_s, k, back)
                    if wait_s is not None:
                        unread.pop(fn, None)
                    elif back[0] < UNREAD_MAX and (fn in unread or len(unread) < UNREAD_FUNCTIONS):
                        unread[fn] = (back[0] + k, back[1] + step_time_s * k)
                if track:
                    if last is not None:  # the capture's steps are known: the ones after it
                        if step - k + 1 > last:
                            phase.add(step, step_time_s, wait_s, k)
                    elif len(rows) < ROWS_MAX:
                        rows.append((step, step_time_s, wait_s, k))
                self._tapped = step
                self._tap_slow(step, f[_T], step_time_s, wait_s, k, f[_FN])

    def _tap_slow(self, step: int, t: float, step_time_s: float, wait_s: float | None, k: int, fn: str) -> None:
        """One call for the slow-steps trigger (under the lock)."""
        sl = self._slow
        prev_t, sl.prev_t = sl.prev_t, t
        between = max(0.0, (t - prev_t) - step_time_s * k) / k if prev_t is not None else 0.0
        row = (step_time_s, wait_s, between)
        if fn != sl.function:  # another step function: its own baseline
            sl.function, sl.run, sl.median = fn, 0, None
            sl.normal.clear()
        if self.state == "capturing" and self._kind == "slow":
            end = self._result_last
            if end is None or step - k + 1 <= end:  # after its Result, only the capture's own calls
                sl.inside.append(row)
            return
        if step <= WARMUP_STEPS:
            return
        if self.state != "idle" and self._kind == "slow":
            return  # a slow capture's steps until its outcome is taken in: that slowdown's
        if self.state == "capturing" or self.state != "idle" and self._reading():
            # Another capture's steps are slowed by the profiler, and so may be those of its
            # reading (the parse shares the cores): held, and judged by the steps after them
            sl.held.append((step, k, row))
            if len(sl.held) > HELD_MAX:  # the newest: a slowdown's first calls are the last held
                del sl.held[0]
            return
        # An input capture's after-measurement's steps are plain steps: a slowdown that begins
        # then, or inside the capture, is counted from its first step, captured at once.
        held, sl.held = sl.held, []
        med = sl.median
        if med is not None and _is_slow(step_time_s, med):
            if sl.run == 0:
                sl.first = step - k + 1
                sl.run_rows.clear()
                for h_step, h_k, h_row in _trailing_slow(held, med):
                    sl.first = min(sl.first, h_step - h_k + 1)
                    sl.run += 1
                    sl.run_rows.append(h_row)
            sl.run += 1
            sl.run_rows.append(row)
            if sl.run >= SLOW_STEPS:
                sl.want = True
            return
        sl.run = 0
        sl.want = False
        sl.normal.append(row)

    # --- at the sample rate, on the agent thread --------------------------------------------

    def __call__(self) -> Iterable[Message]:
        now = self._clock()
        with self._lock:
            bucket, self._bucket = self._bucket, _Sums()
            outcome, self._outcome = self._outcome, None
        probe = self.agent.step_probe
        fetches = getattr(probe, "eager_distributed_fetches", 0)
        bucket.eager_fetches, self._fetches = fetches - self._fetches, fetches
        if bucket.steps:
            self._window.append((now, bucket))
        while self._window and now - self._window[0][0] > WINDOW_S:
            self._window.popleft()
        if outcome is not None and not self._on_outcome(outcome, now):
            with self._lock:  # its steps are not all tapped yet: taken in at a later sample
                self._outcome = self._outcome or outcome
        if (self.state == "after" and (now - self._after_t0 >= AFTER_S or self._phase.steps >= AFTER_STEPS
                                       or self._slow.want)
                and not self._reading()):
            # a slowdown cuts the after-measurement short (its steps are no measure of the
            # capture's cost): its own capture must fall inside it
            msg = self._finish(None if self._slow.want else self._phase.mean_step_s())
            if self._slow.want and self._may_capture(now, self._last_slow_t):
                self._start(now, "slow")
            return [msg] if msg is not None else []
        self._sample_slow()
        if self._slow.want and self.state == "idle" and self._may_capture(now, self._last_slow_t):
            self._start(now, "slow")
            return []
        self._judge(now)
        return []

    def _sample_slow(self) -> None:
        """The slow-steps trigger at the sample rate: the median again; a trace resets the run."""
        traces = self._traces()
        with self._lock:
            sl = self._slow
            if traces != sl.traces:
                sl.traces, sl.run, sl.want = traces, 0, False  # a retrace's slow calls are not a slowdown
            if len(sl.normal) >= SLOW_STEPS:
                times = sorted(r[0] for r in sl.normal)
                n = len(times)
                sl.median = (times[(n - 1) // 2] + times[n // 2]) / 2

    def _may_capture(self, now: float, last_t: float) -> bool:
        """The budget and the conditions every capture nobody asked for shares (``last_t``: the
        previous capture of the same trigger: an input capture does not hold back a slowdown's)."""
        return (self._captures < MAX_CAPTURES and now - last_t >= MIN_GAP_S and self.profiler.active is None
                and not tracemalloc.is_tracing()  # the leak doctor's window (or the script's) slows the steps
                # a light window does not, but the profiler's buffers would grow RSS under it
                and not getattr(getattr(self.agent, "leak_doctor", None), "window_open", False)
                and getattr(self.agent, "num_workers", 1) <= 1  # see the module's docstring
                and self._room())

    def _judge(self, now: float) -> None:
        measured = sum(b.measured for _, b in self._window)
        if measured < MIN_STEPS:
            return
        wait = sum(b.wait_s for _, b in self._window)
        busy = sum(b.measured_time_s for _, b in self._window)
        waiting = busy > 0 and wait / busy >= SHARE_FRAC and wait / measured >= MIN_WAIT_S
        if waiting and not self._episode:
            self._episode = self._want = True
        elif not waiting and self._window[0][0] <= now - WINDOW_S + 2 * self.agent.sample_interval_s:
            self._episode = self._want = False  # a full window below the threshold: the episode ended
        if self._want and self.state == "idle" and not self._eager_fetch() and self._may_capture(now, self._last_t):
            self._start(now)

    def _room(self) -> bool:
        """Room in the run directory for a capture nobody asked for (one statvfs)."""
        try:
            st = os.statvfs(self.agent.run_dir)
        except (OSError, TypeError):
            return False
        return st.f_bavail * st.f_frsize >= MIN_FREE_BYTES

    def _reading(self) -> bool:
        reader = self._reader
        return reader is not None and reader.is_alive()

    def _eager_fetch(self) -> bool:
        """The training fetches its distributed batches eagerly (a fetch for at least every other
        step of the window): that fetch is the wait (the doctor's verdict, with its fix), which no
        stage's measurement changes, so nothing is captured. (Keras' fit under a strategy fetches
        in its compiled step; it fetches eagerly only while it sets up.)"""
        steps = sum(b.steps for _, b in self._window)
        return 2 * sum(b.eager_fetches for _, b in self._window) >= steps > 0

    def _start(self, now: float, kind: str = "input") -> None:
        self._want = False
        self._captures += 1
        if kind == "slow":
            self._last_slow_t = now
        else:
            self._last_t = now
        steps = sum(b.steps for _, b in self._window)
        self._before = sum(b.time_s for _, b in self._window) / steps if steps else None
        with self._lock:
            self.state = "capturing"
            self._kind = kind
            self._phase = _Sums()
            self._rows, self._capture_last, self._result_last, self._waits = [], None, None, 0
            sl = self._slow
            sl.want, sl.inside = False, []
            sl.before = sl.means(sl.normal) if sl.normal else None
        agent = self.agent
        if kind == "slow":
            agent.event("info", PROBE, f"the steps turned {SLOW_FACTOR:g}x slower or more from step {sl.first}: "
                                       f"capturing a profile of {CAPTURE_STEPS} of them (at most {CAPTURE_MAX_S:g} s; "
                                       "tpuwatch run --no-auto-profile turns this off)")
        else:
            agent.event("info", PROBE, f"the step waits for input: capturing a profile of {CAPTURE_STEPS} steps (at "
                                       f"most {CAPTURE_MAX_S:g} s) to "
                                       "measure which tf.data stage the wait comes from (tpuwatch run "
                                       "--no-auto-profile turns this off)")
        agent.submit(Command(id=f"{AUTO_PROFILE_ID_PREFIX}{self._captures}", action="profile",
                             args={"steps": CAPTURE_STEPS, "max_s": CAPTURE_MAX_S}),
                     on_result=self._result)

    def _result(self, ok: bool, message: str, details: dict[str, Any]) -> None:
        """The profile's Result (any thread: the profiler's helper, the training thread, this one)."""
        last = details.get("last_step")
        with self._lock:  # taken in by the next sample (once the steps it held are tapped)
            self._outcome = (ok, message, details)
            self._result_last = int(last) if isinstance(last, (int, float)) else None

    def _on_outcome(self, outcome: tuple[bool, str, dict[str, Any]], now: float, final: bool = False) -> bool:
        """The capture's outcome taken in; False while the steps it held are not all tapped yet
        (``final``: the script has ended, what was tapped is all there is)."""
        ok, message, details = outcome
        first, last = details.get("step"), details.get("last_step")
        # its first step, and its last call's first step
        span = (int(first), int(last)) if isinstance(first, (int, float)) and isinstance(last, (int, float)) else None
        if ok and span is not None and self._tapped < span[1] and not final and self._waits < OUTCOME_WAITS:
            self._waits += 1
            return False
        if self._kind == "slow":
            self._slow_outcome(ok, message, details)
            return True
        if not ok:
            with self._lock:
                self.state = "idle"
            if not self._said_failure:  # said once; a later episode may try again
                self._said_failure = True
                self.agent.event("warning", PROBE, f"auto-profile: no capture ({message})")
            return True
        stopped_by = details.get("stopped_by")
        if stopped_by not in FULL_LENGTH:
            self.agent.event("info", PROBE, f"auto-profile: the capture was cut short ({stopped_by}): "
                                            "too short to measure the stages")
            with self._lock:
                self.state = "idle"
            return True
        with self._lock:  # the steps by number: the capture's, and those after it so far
            inside, after = _Sums(), _Sums()
            for step, step_time_s, wait_s, k in self._rows:
                if span is None or span[0] <= step - k + 1 <= span[1]:  # no numbers: all so far
                    inside.add(step, step_time_s, wait_s, k)
                elif step - k + 1 > span[1]:
                    after.add(step, step_time_s, wait_s, k)
            self._rows = []
            self._capture_last = span[1] if span is not None else -1
            self._inside_steps, self._phase = inside, after
        capture_s = float(details["capture_s"]) if isinstance(details.get("capture_s"), (int, float)) else 0.0
        if capture_s > 0 and inside.time_s < PAUSED_FRAC * capture_s:
            self.agent.event("info", PROBE, f"auto-profile: the capture held {inside.steps} step"
                                            f"{'' if inside.steps == 1 else 's'} of {inside.time_s:.2f} s in "
                                            f"{capture_s:.2f} s (the training stood still): too little to measure "
                                            f"the stages{'' if final else '; capturing again'}")
            with self._lock:
                self.state = "idle"
            if self._episode and not final:
                self._want = True
                self._last_t = now - MIN_GAP_S + RETRY_GAP_S
            return True
        self._inside = inside.mean_step_s()
        with self._lock:  # one change: a sample on the agent thread sees "after" with its start
            self._after_t0 = now
            self.state = "after"
        path = str(details.get("local_path") or details.get("path") or "")
        step_from = span[0] if span is not None else 0
        # the last call's own steps too (steps_per_execution: a call runs several)
        step_to = span[1] + max(1, inside.last_k) - 1 if span is not None else step_from
        self._reader = threading.Thread(target=self._read, args=(path, capture_s, step_from, step_to),
                                        name="tpuwatch-auto-profile-read", daemon=True)
        self._reader.start()
        return True

    def _slow_outcome(self, ok: bool, message: str, details: dict[str, Any]) -> None:
        """The slow steps' capture is in (or failed): one SlowSteps, nothing read here (the
        profile summary reads the capture where it is shown)."""
        with self._lock:
            self.state = "idle"
            self._kind = "input"
            sl = self._slow
            # no call inside a capture that failed at once: the slow calls that set it off
            inside, before, first, fn = sl.inside or list(sl.run_rows), sl.before, sl.first, sl.function
            sl.inside, sl.run, sl.want = [], 0, False
            if ok and inside and before is not None:
                # Captured and said: from here the slow pace is the run's normal, learnt anew, so
                # the same slowdown going on is not a new one once MIN_GAP_S has passed; a
                # slowdown against that pace, or against the old one once the steps are back to
                # it, is. (A capture that failed leaves the old median: the slowdown going on may
                # be captured later, within the run's budget.)
                sl.normal.clear()
                sl.median = None
        if not inside or before is None:
            return
        slow = sl.means(inside)
        first_step, last = details.get("step"), details.get("last_step")
        step_from = int(first_step) if isinstance(first_step, (int, float)) else 0
        step_to = int(last) if isinstance(last, (int, float)) else step_from
        path = str(details.get("local_path") or details.get("path") or "") if ok else ""
        self.agent.emit(SlowSteps(t=self.agent.clock(), path=path, function=fn, first_slow_step=first,
                                  step_from=step_from, step_to=step_to, slow_step_s=round(slow[0], 6),
                                  normal_step_s=round(before[0], 6), slow_wait_s=_round(slow[1]),
                                  normal_wait_s=_round(before[1]), slow_between_s=round(slow[2], 6),
                                  normal_between_s=round(before[2], 6), error="" if ok else message))

    def _read(self, path: str, capture_s: float, step_from: int, step_to: int) -> None:
        """The reader thread: the capture's iterator times (a child Python; never raises)."""
        try:
            xplane = tf_data_trace.find_capture(Path(path))
            if xplane is None:
                raise tf_data_trace.TraceError(f"no .xplane.pb in {path}")
            times = tf_data_trace.read(xplane)
        except Exception as e:  # noqa: BLE001  (TraceError, or a bug here: said once, never raised)
            text = str(e) if isinstance(e, tf_data_trace.TraceError) else f"{type(e).__name__}: {e}"
            self.agent.event("warning", PROBE, f"auto-profile: tf.data's events not read: {text}")
            with self._lock:
                self.state = "idle"
            return
        with self._lock:
            self._measured = (path, capture_s, step_from, step_to, times)

    def _finish(self, after: float | None) -> InputStages | None:
        with self._lock:
            measured, self._measured = self._measured, None
            self.state = "idle"
            self._phase = _Sums()
            self._rows, self._capture_last = [], None
        if measured is None:
            return None
        path, capture_s, step_from, step_to, times = measured
        return InputStages(t=self.agent.clock(), path=path, step_from=step_from, step_to=step_to,
                           capture_s=round(capture_s, 3), fetch_s=round(times.root_s, 6), iterators=times.names,
                           self_s=tuple(round(s, 6) for s in times.self_s), calls=times.calls,
                           busy_s=tuple(round(s, 6) for s in times.busy_s),
                           step_time_before_s=self._before, step_time_inside_s=self._inside,
                           step_time_after_s=after)

    # --- the script starts a profile of its own ----------------------------------------------

    def make_start(self, original: Callable[..., Any]) -> Callable[..., Any]:
        this = self

        def start(*args: Any, **kwargs: Any) -> Any:
            try:
                this.yield_to_script()
            except Exception as e:  # the script's start goes on; only this probe stops
                this.agent.probe_failed(PROBE, e)
            return original(*args, **kwargs)

        return start

    def yield_to_script(self) -> None:
        """Stops an automatic capture under way (and waits for it) so the script's starts."""
        capture = self.profiler.active
        if capture is None or not capture.cmd.id.startswith(AUTO_PROFILE_ID_PREFIX):
            return
        capture.request_stop("the script started a profile of its own")
        if capture.thread is threading.current_thread():
            return
        deadline = time.monotonic() + YIELD_WAIT_S  # until the profiler is free (its thread may not exist yet)
        while self.profiler.active is capture and time.monotonic() < deadline:
            time.sleep(0.01)

    # --- the script ended --------------------------------------------------------------------

    def shutdown(self) -> None:
        """After the profiler's own shutdown (it ends a capture still running): what was
        measured is sent, its step time after the capture as far as there was one."""
        with self._lock:
            pending = self._result_last if self._outcome is not None else None
        if pending is not None and self._tapped < pending:
            # the capture's steps may still be in the agent's buffer: drained, then tapped
            self.agent.flush()
            deadline = time.monotonic() + EXIT_TAP_WAIT_S
            while self._tapped < pending and time.monotonic() < deadline:
                time.sleep(0.01)
        with self._lock:
            outcome, self._outcome = self._outcome, None
        if outcome is not None:
            self._on_outcome(outcome, self._clock(), final=True)
        reader = self._reader
        if reader is not None:
            reader.join(READ_WAIT_AT_EXIT_S)  # bounded: the script has ended, its exit waits
        if self.state == "after" and not self._reading():
            msg = self._finish(self._phase.mean_step_s())
            if msg is not None:
                self.agent.emit(msg)


def _round(v: float | None) -> float | None:
    return round(v, 6) if v is not None else None


def install(agent: "Agent", patches: "Patches") -> AutoProfile | None:
    """Registers the tap and the sampler (patches nothing); None without the profile command."""
    from tpuwatch.agent.profiler import Profiler

    profiler = agent.profiler
    if not isinstance(profiler, Profiler):  # None: the profile command is not installed
        return None
    import tensorflow as tf
    from tensorflow.python.profiler import profiler_v2  # TF 2.16-2.21

    auto = AutoProfile(agent, profiler)
    # the public name holds its own reference (tf.profiler.experimental.start), the module's is what
    # its Profile context manager calls
    patches.wrap(profiler_v2, "start", auto.make_start)
    patches.wrap(tf.profiler.experimental, "start", auto.make_start)
    agent.step_taps.append((PROBE, auto.tap_all))
    agent.add_sampler(PROBE, auto)
    agent.on_shutdown(auto.shutdown)
    return auto

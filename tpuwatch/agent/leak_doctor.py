"""The leak doctor: when host memory climbs during training, which lines of the script allocate it.

Runs on the agent thread at the sample rate and costs nothing until growth is suspected: it reads
the process RSS from ``/proc/self/statm``, kept open (:mod:`tpuwatch.agent.proc_stats`; no psutil
import on this thread, see :mod:`tpuwatch.agent.memory`) as points ``POINT_S`` apart, whatever the
agent's sample rate, and keeps ``MAX_POINTS`` of them. Suspected: RSS rose at every point of a run of
at least ``RISE_SAMPLES`` (3 s) and by at least ``RISE_MIN_BYTES`` over the whole run (up to 10 s:
a slower leak, as slower steps make one, climbs as surely), or by ``FAST_RISE_BYTES`` over the last
``FAST_SAMPLES`` (a short run's training may end before six points), and the growth since
training began exceeds what the pipelines' caches and shuffle buffers hold (:mod:`.pipeline_map`)
by ``BEYOND_HELD_BYTES``, with no tf.function traced meanwhile (graphs growing are the retrace
finding's; tracing under tracemalloc ran 7x slower). Then, at most
``MAX_WINDOWS`` times a run and never while the script traces allocations itself, a window samples
for ``WINDOW_S`` seconds (from ``MIN_WINDOW_S`` on, it ends as soon as RSS grew ``ENOUGH_BYTES`` in
it), and its sites are sent as one :class:`~tpuwatch.protocol.AllocationSites`, with the step time
inside the window and just before it (the window's cost).

Each window is *light* first: two passes over the objects, at its start and its end (below), and
nothing in between, so the steps inside it run at their own speed. When its first site is a line of
the script, the only one that could add to its container's names, that holds at least
``EXPLAINED_SHARE`` of what RSS grew meanwhile, that is the answer. Otherwise, while RSS still
climbed by ``RISE_MIN_BYTES`` and what ``_open`` asks still holds, a second window follows at once
with ``tracemalloc`` on, which every allocation of the script's Python pays for (1.5-2.7x a small
step): a snapshot after its first sample, one at the end, diffed by traceback; each growing
allocation is charged to the innermost frame of the script (outside TensorFlow, Keras, NumPy,
tpuwatch and the standard library). A light window that found nothing and is not followed sends
nothing; one whose only line held too little is sent if tracemalloc's finds nothing.
A window still open when the script ends is closed by a shutdown hook; the script's frames have
returned by then, and a diff that finds nothing (what they kept was freed with them) is dropped
rather than sent as "nothing grew".

TensorFlow allocates a tensor's buffer (and its Python object) outside Python's allocator, so
tracemalloc does not see a list of tensors grow. The window therefore also diffs the eager
tensors the garbage collector tracks (TensorFlow's tensor counter read at its start; one
``gc.get_objects()`` walk at its end, no other thread in Python meanwhile (:mod:`.heap`), once a window: tens of ms,
``bench/leak_tensor_pass.py``): the tensors alive at its end that were made after its start,
their bytes, the list, dict or deque that holds most of them, the name it is bound to (a local
of the script's running functions, a global of the script, or an attribute of an object one of
those names; found walking down from them, never with ``gc.get_referrers``, which traverses
every object and crashed the interpreter once under TensorFlow), and the script's line that
adds to that name (``NAME.append(`` / ``NAME[key] =``); that line is a site of kind
``"tensors"`` (``"scalar tensors"`` when every one is a scalar, such as a loss), or a site
``""`` when the line is not found. The same end pass diffs the lengths of the lists and dicts held
at the start, and charges the one that gained the most bytes (NumPy arrays, ``get_weights()``
copies, Python objects) to the line that adds to its name (kind ``"numpy"`` or ``"python"``).
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import re
import sys
import sysconfig
import threading
import time
import types
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable

from tpuwatch.agent import heap, proc_stats
from tpuwatch.protocol import AllocationSites, Message

if TYPE_CHECKING:
    import tracemalloc

    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.patches import Patches

PROBE = "leak_doctor"
POINT_S = 0.5  # RSS points this far apart (the agent samples at 4 Hz by default, 0.5-20 Hz by --sample-hz)
RISE_SAMPLES = 6  # rising points in a row, at least (3 s)
MAX_POINTS = 20  # the longest run of rising points judged (10 s): 24 MiB over it is 2.4 MiB a second
RISE_MIN_BYTES = 24 << 20
# or a climb of this much over the last FAST_SAMPLES points (0.5 s: ~100 MiB a second)
FAST_SAMPLES = 1
FAST_RISE_BYTES = 48 << 20
BEYOND_HELD_BYTES = 64 << 20
WARMUP_STEPS = 10
WINDOW_S = 3.0
# a window ends sooner once it has seen this much growth over at least MIN_WINDOW_S: a fast leak
# needs no 3 s under tracemalloc (which slows every step), and a short run may end before 3 s do
MIN_WINDOW_S = 1.0
ENOUGH_BYTES = 2 * RISE_MIN_BYTES
FRAMES = 8  # frames kept per allocation: enough to climb from NumPy code to the script's (cost grows with it)
MAX_WINDOWS = 2
# of RSS's growth in a light window, what its first site must hold for tracemalloc's to be skipped
EXPLAINED_SHARE = 0.5
MAX_RETRIES = 3  # windows with no evidence (no step ran, nothing grew) that do not count, a run
MIN_GAP_S = 60.0  # between two windows
TOP = 5
_MIN_SITE_BYTES = 1 << 20  # sites that grew less are left out
_MAX_CODE = 160


def _library_roots() -> tuple[str, ...]:
    roots = {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.abspath(path))
    for mod in ("numpy", "tensorflow", "keras"):
        m = sys.modules.get(mod)
        if getattr(m, "__file__", None):
            roots.add(os.path.dirname(os.path.dirname(os.path.abspath(m.__file__))))  # type: ignore[union-attr, arg-type]
    return tuple(r + os.sep for r in roots)


def _kind(path: str) -> str:
    """The package whose code allocated: the first folder under site-packages, else "python"."""
    for marker in ("site-packages", "dist-packages"):
        i = path.find(marker + os.sep)
        if i >= 0:
            return path[i + len(marker) + 1:].split(os.sep, 1)[0].removesuffix(".py")
    return "python"


class LeakDoctor:
    def __init__(self, agent: "Agent", rss: Callable[[], int], clock: Callable[[], float] = time.monotonic,
                 held: Callable[[], int] = lambda: 0, traces: Callable[[], int] = lambda: 0,
                 script_dir: str | None = None) -> None:
        self.agent = agent
        # where the script's own modules are (None: the folder of __main__'s file, the script)
        self._script_dir = script_dir
        self._rss = rss
        self._clock = clock
        self._held = held
        self._traces = traces
        # (t, step, rss, traces so far)
        self._points: deque[tuple[float, int, int, int]] = deque(maxlen=MAX_POINTS + 1)
        self._base: int | None = None  # RSS once training was under way
        self._windows = 0
        self._retries = 0  # windows that found no evidence and did not count
        self._last_window_t = -1e18
        self._window: dict[str, Any] | None = None
        self._roots: tuple[str, ...] | None = None
        self._site_files: list[str] = []
        self._lock = threading.Lock()  # the agent thread's samples vs close() at the script's end

    @property
    def window_open(self) -> bool:
        """A window is under way (light or with tracemalloc)."""
        return self._window is not None

    def __call__(self) -> Iterable[Message]:
        with self._lock:
            try:
                return self._sample()
            except BaseException:
                self._abandon()  # the probe is disabled by the agent: tracemalloc must not stay on
                raise

    def _abandon(self) -> None:
        """Ends the window under way, if any, without a verdict (tracemalloc stopped if it was ours)."""
        w, self._window = self._window, None
        if w is not None and not w["light"]:
            import tracemalloc

            tracemalloc.stop()

    def _sample(self) -> Iterable[Message]:
        now = self._clock()
        step = self.agent.global_step
        if self._window is not None:
            return self._advance(now, step)
        if step < WARMUP_STEPS or self._windows >= MAX_WINDOWS:
            return ()
        if self._profiling():  # the profiler's buffers grow RSS meanwhile: no evidence of a leak
            self._points.clear()
            self._base = None
            return ()
        if self._points and now - self._points[-1][0] < 0.9 * POINT_S:  # (the agent's pace jitters)
            return ()
        rss = self._rss()
        if self._base is None:
            self._base = rss
        self._points.append((now, step, rss, self._traces()))
        if self._suspected() and now - self._last_window_t >= MIN_GAP_S:
            self._open(now, step)
        return ()

    def _profiling(self) -> bool:
        """A profile capture runs (the auto-profile's or the user's): the two together slow the
        steps more than either, and each skews the other's measure; the window waits."""
        profiler = getattr(self.agent, "profiler", None)
        return getattr(profiler, "active", None) is not None

    def _suspected(self) -> bool:
        pts = list(self._points)
        # the run of points since RSS last stood still or fell, or TF last traced
        k = len(pts) - 1
        while k > 0 and pts[k][2] > pts[k - 1][2] and pts[k][3] == pts[k - 1][3]:
            k -= 1
        rising = pts[k:]
        # RISE_SAMPLES rising points at least, or FAST_SAMPLES of a climb too fast to wait for more
        # (a short run's training can be over before six points are)
        return ((len(rising) > RISE_SAMPLES and self._rose(rising, RISE_MIN_BYTES))
                or (len(rising) > FAST_SAMPLES and self._rose(rising[-FAST_SAMPLES - 1:], FAST_RISE_BYTES)))

    def _rose(self, pts: list[tuple[float, int, int, int]], need: int) -> bool:
        if pts[-1][1] == pts[0][1]:
            return False  # no step since (a pause is not a leak)
        if pts[-1][3] != pts[0][3]:
            return False  # TF traced meanwhile: graphs grow (the retrace finding's), and tracing
            # under tracemalloc is many times slower
        if any(b[2] <= a[2] for a, b in zip(pts, pts[1:])):
            return False
        if pts[-1][2] - pts[0][2] < need:
            return False
        return pts[-1][2] - (self._base or 0) > self._held() + BEYOND_HELD_BYTES

    def _open(self, now: float, step: int) -> None:
        import tracemalloc

        if tracemalloc.is_tracing():
            self._windows = MAX_WINDOWS  # the script traces allocations itself: leave it alone
            return
        first_t, first_step, _, _ = self._points[0]
        before = (now - first_t) / (step - first_step) if step > first_step else None
        self._windows += 1
        self._last_window_t = now
        self._start(now, step, before, light=True)

    def _start(self, now: float, step: int, before: float | None, light: bool,
               light_found: AllocationSites | None = None) -> None:
        """A window from the next sample on: ``light``, the tensor and container diffs only (no
        cost between its two passes); else with tracemalloc too, which the script's Python pays
        for every allocation (1.5-2.7x the step time at a small step). ``light_found``: what the
        light window before it found, sent if this one finds nothing."""
        import tracemalloc

        # Python called from TensorFlow's threads (tf.numpy_function, py_function, from_generator)
        # can free NumPy buffers while tracemalloc stops: this Python then dies by SIGSEGV (seen
        # with a tf.numpy_function map, tracemalloc started and stopped on another thread, no
        # tpuwatch at all). Such a script only ever gets light windows.
        only_light = _python_on_tf_threads()
        light = light or only_light
        if not light:
            tracemalloc.start(FRAMES)
        self._window = {"t0": now, "step0": step, "before": before, "snap": None, "tensors": None,
                        "light": light, "escalate": light and not only_light, "started": False,
                        "containers": [], "traces": self._traces(), "light_found": light_found}

    def _may_follow(self, w: dict[str, Any]) -> bool:
        """Whether tracemalloc's window may follow the light window ``w`` now: what ``_open``
        asks of any window (the script does not trace allocations itself, no profile is captured,
        no tf.function traced meanwhile)."""
        import tracemalloc

        return not tracemalloc.is_tracing() and not self._profiling() and self._traces() == w["traces"]

    def close(self) -> None:
        """The script has ended (a shutdown hook): a window still open ends now, with what it
        saw so far (its sites would be lost, and tracemalloc would slow the exit)."""
        with self._lock:
            w = self._window
            if w is None:
                return
            if not w["started"] or self.agent.global_step <= w["step1"]:
                # no first snapshot yet, or no training step since it: nothing to charge to the
                # training (what the script's teardown allocates is no leak); what a light window
                # before this one found still goes
                import tracemalloc

                if not w["light"]:
                    tracemalloc.stop()
                self._window = None
                if w["light_found"] is not None:
                    self.agent.emit(w["light_found"], force=True)
                return
            for msg in self._advance(self._clock(), self.agent.global_step, early=True):
                if isinstance(msg, AllocationSites) and not msg.sites:
                    # the script's frames have returned and freed what they kept: "nothing grew"
                    # would be false; the finding keeps its general advice
                    continue
                self.agent.emit(msg, force=True)

    def _advance(self, now: float, step: int, early: bool = False) -> Iterable[Message]:
        import tracemalloc

        w = self._window
        assert w is not None
        if not w["started"]:
            w["started"] = True
            w["snap"] = None if w["light"] else tracemalloc.take_snapshot()
            w["tensors"] = _tensor_mark()
            if self._roots is None:
                self._roots = _library_roots()
            w["containers"] = _containers(self._roots)
            w["t1"], w["step1"], w["rss1"] = now, step, self._rss()
            return ()
        if now - w["t0"] < WINDOW_S and not early and not self._enough(w, now):
            return ()
        end = None
        try:
            if not w["light"]:
                end = tracemalloc.take_snapshot()
        finally:
            if not w["light"]:
                tracemalloc.stop()
            self._window = None
            self._points.clear()
        if step <= w["step1"]:
            # no step ran while it sampled (an epoch boundary, an evaluation, a save): no evidence
            # either way; it does not count, and the next steps that climb open another
            del end, w["containers"]
            if w["light_found"] is not None:
                return (w["light_found"],)  # what the light window before it found still goes
            self._retry()
            return ()
        inside = (now - w["t0"]) / (step - w["step0"]) if step > w["step0"] else None
        if end is not None:
            sites = self._sites(w["snap"], end, now - w["t1"], w["step1"], step, inside, w["before"])
        else:
            sites = AllocationSites(t=self.agent.clock(), window_s=round(now - w["t1"], 3), step_from=w["step1"],
                                    step_to=step, step_time_inside_s=inside, step_time_before_s=w["before"],
                                    sites=(), grown_bytes=(), blocks=(), kinds=(), code=())
        sites = dataclasses.replace(sites, rss_grown_bytes=self._rss() - w["rss1"])
        if self._roots is None:
            self._roots = _library_roots()
        found = sites
        ambiguous: set[str] = set()  # sites named by a container's name that other lines add to too
        try:
            found = _with_tensors(found, w["tensors"], self._roots, self._site_files, ambiguous, self._script_dir)
        except Exception as e:  # noqa: BLE001  (a TF without what the pass reads: the Python sites still go)
            self.agent.probe_failed(PROBE + ".tensors", e)
        try:
            found = _with_containers(found, w.pop("containers"), self._roots, self._site_files, ambiguous,
                                     self._script_dir)
        except Exception as e:  # noqa: BLE001  (a container that cannot be read: the other sites still go)
            self.agent.probe_failed(PROBE + ".containers", e)
        if w["escalate"] and not early and not _explains(found, ambiguous):
            if (found.rss_grown_bytes or 0) >= RISE_MIN_BYTES and self._may_follow(w):
                # the light window named no line, or not one line alone, for most of what grew:
                # tracemalloc's window follows at once (the growth is established); its sites are
                # the ones sent, these if it finds none and they name one line alone
                kept = (_without(found, ambiguous) if found.sites and found.sites[0] and found.sites[0] not in ambiguous
                        else None)
                self._start(now, step, w["before"], light=False, light_found=kept)
                return ()
        light_found = w["light_found"]
        if w["light"]:
            # No tracemalloc looked, nor will. A line that other lines add to the same name too is
            # not the one to change (the first of them is often not the one that grows); where it
            # was the first site, the next is named only if it holds most of what grew.
            if ambiguous.intersection(found.sites):
                first_dropped = found.sites[0] in ambiguous
                found = _without(found, ambiguous)
                if first_dropped and not _explains(found, set()):
                    found = _without(found, set(found.sites))
            if not found.sites and light_found is None:
                # nothing to charge, and tracemalloc did not look: no "native memory" claim
                if not early:
                    self._retry()
                return ()
        if not found.sites and light_found is not None:
            found = light_found  # tracemalloc's window found nothing: the light one's sites stand
        if not found.sites:
            self._retry()  # nothing to charge: if the growth goes on, look again (not 60 s later)
        return (found,)

    def _retry(self) -> None:
        """The window just closed found no evidence: it does not count against ``MAX_WINDOWS``
        (at most ``MAX_RETRIES`` such a run), and the next one may open as soon as RSS climbs."""
        if self._retries < MAX_RETRIES:
            self._retries += 1
            self._windows -= 1
            self._last_window_t = -1e18

    def _enough(self, w: dict[str, Any], now: float) -> bool:
        grown: int = self._rss() - w["rss1"]
        return now - w["t1"] >= MIN_WINDOW_S and grown >= ENOUGH_BYTES

    def _sites(self, start: tracemalloc.Snapshot, end: tracemalloc.Snapshot, window_s: float, step_from: int, step_to: int,
               inside: float | None, before: float | None) -> AllocationSites:
        import tracemalloc

        roots = self._roots
        if roots is None:
            roots = self._roots = _library_roots()
        keep = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, __file__)]
        diffs = end.filter_traces(keep).compare_to(start.filter_traces(keep), "traceback")
        by_site: dict[tuple[str, int], list[Any]] = {}
        traced = 0
        for d in diffs:
            if d.size_diff <= 0:
                continue
            traced += d.size_diff
            frames = list(reversed(d.traceback))  # most recent call first (it is stored oldest first)
            user = next((f for f in frames if not f.filename.startswith(roots)
                         and not f.filename.startswith("<")), None)
            if user is None:
                continue
            kind = "python" if frames[0] is user else _kind(frames[0].filename)
            entry = by_site.setdefault((user.filename, user.lineno), [0, 0, kind])
            entry[0] += d.size_diff
            entry[1] += max(d.count_diff, 0)
        by_site = _at_storing_lines(by_site)
        top = sorted(by_site.items(), key=lambda kv: -kv[1][0])[:TOP]
        # every file the script grew in, small growth too: a list's own array grows where it is appended to
        self._site_files = [f for (f, _), _ in sorted(by_site.items(), key=lambda kv: -kv[1][1])]
        top = [kv for kv in top if kv[1][0] >= _MIN_SITE_BYTES]
        return AllocationSites(
            t=self.agent.clock(), window_s=round(window_s, 3), step_from=step_from, step_to=step_to,
            step_time_inside_s=inside, step_time_before_s=before,
            sites=tuple(f"{os.path.basename(f)}:{n}" for (f, n), _ in top),
            grown_bytes=tuple(v[0] for _, v in top), blocks=tuple(v[1] for _, v in top),
            kinds=tuple(v[2] for _, v in top),
            code=tuple(linecache.getline(f, n).strip()[:_MAX_CODE] for (f, n), _ in top),
            traced_bytes=traced)


_ASSIGNED = re.compile(r"^(?P<indent>\s*)(?P<name>[A-Za-z_]\w*)\s*=(?!=)")
_STORE_SCAN_LINES = 30  # lines after an allocation searched for the line that keeps its result


def _storing_line(path: str, lineno: int) -> int | None:
    """The line after ``lineno`` (``NAME = ...``, an allocation) that adds ``NAME`` to a
    container (``X.append(NAME)``, ``X[key] = NAME``), in the same block; None when there is
    none. The allocation is where the bytes were made, the store is what keeps them (and the line
    the fix edits): a memo that normalises a batch and keeps it."""
    lines = linecache.getlines(path)
    if not 0 < lineno <= len(lines):
        return None
    m = _ASSIGNED.match(lines[lineno - 1])
    if m is None:
        return None
    name, indent = re.escape(m["name"]), len(m["indent"])
    store = re.compile(rf"(?<![\w.])[A-Za-z_][\w.]*\s*(?:\.\s*(?:append|appendleft|insert|add)\s*"
                       rf"\((?:[^()]*,\s*)?{name}\s*\)|\[[^\]]+\]\s*=\s*{name}\s*$)")
    for n in range(lineno, min(len(lines), lineno + _STORE_SCAN_LINES)):
        text = lines[n].split("#", 1)[0].rstrip()
        if not text.strip():
            continue
        if len(text) - len(text.lstrip()) < indent:
            return None  # the block ended
        if store.search(text):
            return n + 1
    return None


def _at_storing_lines(by_site: dict[tuple[str, int], list[Any]]) -> dict[tuple[str, int], list[Any]]:
    """``by_site`` with each allocation moved to the line that stores its result, where one does."""
    out: dict[tuple[str, int], list[Any]] = {}
    for (path, lineno), entry in by_site.items():
        stored = _storing_line(path, lineno)
        key = (path, stored) if stored is not None else (path, lineno)
        have = out.get(key)
        if have is None:
            out[key] = list(entry)
        else:
            have[0] += entry[0]
            have[1] += entry[1]
    return out


_MAX_TENSORS = 256  # new tensors whose bytes are read (the rest extrapolated: ~40 us each)
_MIN_TENSORS = 1000  # new tensors reported however small (a loss kept per step)
_HOLDER_SAMPLE = 16  # new tensors whose holders are looked up


def _eager_tensor_type() -> type | None:
    ops = sys.modules.get("tensorflow.python.framework.ops")
    t = getattr(ops, "EagerTensor", None)  # private name: absent, the tensor diff is skipped
    return t if isinstance(t, type) else None


def _tensor_mark() -> tuple[type, int] | None:
    """The eager tensor type and a fresh id from TensorFlow's counter, which numbers every eager
    tensor as it is made (``EagerTensor._id``): a tensor with a larger id was made later. Not
    Python's ``id()``: a new tensor takes the address of one that died meanwhile (CI, 2026-11-26:
    a gc during the window freed tensors whose addresses every new one then took)."""
    t = _eager_tensor_type()
    ops = sys.modules.get("tensorflow.python.framework.ops")
    uid = getattr(ops, "uid", None)  # private names: absent, the tensor diff is skipped
    if t is None or not callable(uid):
        return None
    return t, int(uid())


def _tensor_bytes(tensors: list[Any]) -> tuple[int, bool]:
    """(bytes, every one a scalar) of ``tensors``: each one's buffer (at least the 64 bytes TF's
    allocator aligns to) and its Python object, extrapolated past ``_MAX_TENSORS``. A lower
    bound: TF's handle and shape records are left out."""
    total, scalars = 0, True
    for o in tensors[:_MAX_TENSORS]:
        try:
            n = o.shape.num_elements()
            total += max((n or 0) * o.dtype.size, 64) + sys.getsizeof(o)
            scalars = scalars and o.shape.rank == 0
        except (AttributeError, TypeError, ValueError):
            continue
    if len(tensors) > _MAX_TENSORS:
        total = total * len(tensors) // _MAX_TENSORS
    return total, scalars


def _holder(candidates: list[Any], sample: list[Any]) -> Any:
    """Of ``candidates``, the container that holds most of ``sample``, directly or one level down
    (each step's tensors in a tuple or a small dict: ``(loss, logits)``, ``{"logits": ...}``), or
    None when none holds half of it. Walks down from the containers only: ``gc.get_referrers``
    traverses every object of the process and crashed the interpreter once under TensorFlow."""
    want = {id(o) for o in sample}
    best, most = None, 0
    for r in candidates:
        items = list(r.values() if type(r) is dict else r)
        held = len(want.intersection(map(id, items)))  # in C: no __eq__
        if held * 2 < len(sample):
            for item in items:
                inner = _inner(item)
                if inner:
                    held += len(want.intersection(map(id, inner)))
                    for sub in inner:  # a tuple of per-replica values: (loss, logits) under a strategy
                        per_replica = _replica_values(sub)
                        if per_replica:
                            held += len(want.intersection(map(id, per_replica)))
        if held > most:
            best, most = r, held
    return best if most * 2 >= len(sample) else None


def _own_dict(obj: Any) -> dict[str, Any] | None:
    """``obj``'s own ``__dict__``, read without its class's attribute hooks (a lazily loaded
    module would import on the agent's thread, a proxy would run its code; ``isinstance`` would
    ask ``__class__``); None for a class, or an object without one."""
    if issubclass(type(obj), type):
        return None
    try:
        d = object.__getattribute__(obj, "__dict__")
    except Exception:  # noqa: BLE001  (no __dict__: slots, a C object)
        return None
    return d if type(d) is dict else None


def _replica_values(item: Any) -> tuple[Any, ...]:
    """A tf.distribute value's per-replica tensors (``PerReplica._values``: a strategy's step
    returns one per output), read from the instance's own dict (no attribute lookup that could
    run the object's code); () for anything else."""
    d = _own_dict(item)
    values = d.get("_values") if d is not None else None
    return values if type(values) is tuple and len(values) <= _HOLDER_SAMPLE else ()


def _inner(item: Any) -> tuple[Any, ...] | list[Any]:
    """What one step's entry holds directly: a tuple's items, a small dict's values, a
    tf.distribute value's per-replica tensors."""
    tp = type(item)
    if tp is tuple:
        return tuple(item)
    if tp is dict and len(item) < _HOLDER_SAMPLE:
        return list(item.values())
    return _replica_values(item)


def _names(container: Any, frames: list[Any]) -> tuple[list[str], list[str]]:
    """(the names that bind ``container`` first, every name that binds it): a local of one of
    ``frames`` (the script's running functions), else a global of the script, else an attribute
    of an object one of those holds (``self.history``, ``h.losses``). Only downward from the
    script's own names: no ``gc.get_referrers``."""
    main = sys.modules.get("__main__")
    modules = {id(f.f_globals): f.f_globals for f in frames}  # the globals of the script's modules
    if main is not None:
        modules.setdefault(id(vars(main)), vars(main))
    scopes = [dict(f.f_locals) for f in frames] + [dict(g) for g in modules.values()]
    local = [k for f in frames for k, v in f.f_locals.items() if v is container]
    bound = [k for scope in scopes for k, v in scope.items() if v is container and isinstance(k, str)]
    held = []
    for scope in scopes:
        for v in scope.values():
            d = _own_dict(v)
            if d is not None:
                held += [k for k, a in list(d.items()) if a is container and isinstance(k, str)]
    return (local or bound or held), local + bound + held


# what follows a container's name on a line that adds to it: a call of one of its adding methods,
# or a store into it (not a comparison)
_ADDS = r"\.\s*(?:append|extend|insert|appendleft|add|setdefault|update)\s*\(|\[[^\]]+\]\s*=(?!=)"


def _adding_line(names: list[str], files: list[str],
                 aliases: list[str] | None = None) -> tuple[tuple[str, int] | None, bool]:
    """(the first line of ``files`` that adds to one of ``names``: ``NAME.append(`` and kin, or
    ``NAME[key] = `` (``self.NAME`` matches too); whether no other line of them could add to
    ``names`` or ``aliases`` (other names of the same container): for that count a line's
    comments and strings count too, and ``NAME +=``, ``NAME |=`` and ``heappush(NAME`` add as
    well, so a doubt counts as another line)."""
    if not names:
        return None, False
    alt = "|".join(re.escape(n) for n in dict.fromkeys(names))
    pattern = re.compile(rf"(?<![\w])(?:{alt})\s*(?:{_ADDS})")
    every = "|".join(re.escape(n) for n in dict.fromkeys([*names, *(aliases or ())]))
    could = re.compile(rf"(?<![\w])(?:{every})\s*(?:{_ADDS}|[+|]=)|heappush\s*\(\s*(?:{every})\b")
    first, others = None, 0
    for f in files:
        for n, line in enumerate(linecache.getlines(f), start=1):
            if first is None and pattern.search(line.split("#", 1)[0]):
                first = (f, n)
            elif could.search(line):
                others += 1
            if first is not None and others:
                return first, False
    return first, first is not None and not others


_Row = tuple[str, int, int, str, str]  # a site's (line, grown bytes, blocks, kind, code)


def _rows(found: AllocationSites) -> list[_Row]:
    return list(zip(found.sites, found.grown_bytes, found.blocks, found.kinds, found.code))


def _with_rows(found: AllocationSites, rows: list[_Row]) -> AllocationSites:
    """``found`` with ``rows`` as its sites, the rest of it as it is."""
    return dataclasses.replace(found, sites=tuple(r[0] for r in rows), grown_bytes=tuple(r[1] for r in rows),
                               blocks=tuple(r[2] for r in rows), kinds=tuple(r[3] for r in rows),
                               code=tuple(r[4] for r in rows))


def _without(found: AllocationSites, sites: set[str]) -> AllocationSites:
    """``found`` less the rows of ``sites``."""
    return _with_rows(found, [r for r in _rows(found) if r[0] not in sites])


def _explains(found: AllocationSites, ambiguous: set[str]) -> bool:
    """Whether the window's first site is a line of the script, the only one that adds to its
    container, that holds at least ``EXPLAINED_SHARE`` of what RSS grew meanwhile (unknown growth:
    at least such a site)."""
    if not found.sites or not found.sites[0] or found.sites[0] in ambiguous:
        return False
    grown = found.rss_grown_bytes
    return grown is None or found.grown_bytes[0] >= EXPLAINED_SHARE * grown


def _python_on_tf_threads() -> bool:
    """Whether the script has made a Python function TensorFlow calls from its own threads
    (``tf.numpy_function``, ``tf.py_function``, ``Dataset.from_generator``: TensorFlow's
    registry of them, a private name; absent: False)."""
    ops = sys.modules.get("tensorflow.python.ops.script_ops")
    registry = getattr(ops, "_py_funcs", None)
    size = getattr(registry, "size", None)
    return callable(size) and int(size()) > 0


_MIN_GROWN_ITEMS = 8  # entries a container must gain in the window to be looked at
_HOLDER_TRIES = 4  # containers that gained the most, looked up for the script's line


def _containers(roots: tuple[str, ...] | None = None) -> list[tuple[Any, int]]:
    """Every list and dict of ``_HOLDER_SAMPLE`` entries or more, with its length, held from a
    window's start to its end: those the garbage collector tracks (one pass), and those the
    script's names hold (its running frames' locals, its globals, their objects' attributes): a
    dict whose keys and values are all untracked (ints to NumPy arrays, a memo) is untracked by
    CPython itself, so no gc pass lists it."""
    out = [(o, len(o)) for o in heap.objects_of((list, dict)) if len(o) >= _HOLDER_SAMPLE]
    seen = {id(o) for o, _ in out}
    for o in _script_held(roots if roots is not None else _library_roots()):
        if id(o) not in seen:
            seen.add(id(o))
            out.append((o, len(o)))
    return out


def _script_held(roots: tuple[str, ...]) -> list[Any]:
    """The lists and dicts of ``_HOLDER_SAMPLE`` entries or more that the script's names hold,
    directly or as an attribute of an object they hold."""
    frames = []
    for top in sys._current_frames().values():
        frame: Any = top
        while frame is not None:
            name = frame.f_code.co_filename
            if not name.startswith(roots) and not name.startswith("<") and name != __file__:
                frames.append(frame)
            frame = frame.f_back
    main = sys.modules.get("__main__")
    modules = {id(f.f_globals): f.f_globals for f in frames}  # the script's modules' globals
    if main is not None:
        modules.setdefault(id(vars(main)), vars(main))
    scopes = [dict(f.f_locals) for f in frames] + [dict(g) for g in modules.values()]
    del frames, modules
    found = []
    for scope in scopes:
        for v in scope.values():
            if (type(v) is list or type(v) is dict) and len(v) >= _HOLDER_SAMPLE:
                found.append(v)
            else:
                d = _own_dict(v)
                if d is not None:
                    # a copy first: the training thread may set an attribute meanwhile
                    found += [a for a in list(d.values())
                              if (type(a) is list or type(a) is dict) and len(a) >= _HOLDER_SAMPLE]
    return found


def _item_bytes(item: Any) -> tuple[int, bool]:
    """(bytes, is NumPy's) of one entry a container gained: an array's buffer, a list or tuple
    of arrays (``get_weights()``), else the object itself."""
    nbytes = getattr(item, "nbytes", None) if type(item).__module__ == "numpy" else None
    if isinstance(nbytes, int):
        size = sys.getsizeof(item)  # an array that owns its buffer counts it; a view does not
        return (size if size >= nbytes else size + nbytes), True
    if type(item) in (list, tuple) and len(item) <= 4 * _HOLDER_SAMPLE:
        parts = [_item_bytes(x) for x in item]
        return sys.getsizeof(item) + sum(b for b, _ in parts), any(n for _, n in parts)
    return sys.getsizeof(item), False


def _with_containers(sites: AllocationSites, start: list[tuple[Any, int]], roots: tuple[str, ...],
                     site_files: list[str], ambiguous: set[str] | None = None,
                     script_dir: str | None = None) -> AllocationSites:
    """``sites`` with the list or dict that gained the most bytes in the window charged to the
    line that adds to it: NumPy arrays whose buffers TensorFlow allocated (``get_weights()``
    under a strategy) and Python allocations on TensorFlow's threads are invisible to
    tracemalloc, or it did not run. Entries added at the end (a list's append, a dict's new keys,
    which keep insertion order); their bytes from up to ``_HOLDER_SAMPLE`` of them. A site whose
    line is the first of several that add to the container's names goes into ``ambiguous``."""
    grew: list[tuple[int, int, bool, Any]] = []  # (bytes gained, entries gained, NumPy's, container)
    for o, n0 in start:
        gained = len(o) - n0
        if gained < _MIN_GROWN_ITEMS:
            continue
        items = list(o.values())[n0:] if type(o) is dict else o[n0:]
        stride = max(1, len(items) // _HOLDER_SAMPLE)
        sample = [_item_bytes(x) for x in items[::stride][:_HOLDER_SAMPLE]]
        grown = sum(b for b, _ in sample) * len(items) // len(sample)
        if grown >= _MIN_SITE_BYTES:
            grew.append((grown, len(items), any(n for _, n in sample), o))
    del start
    # the largest whose line is found: TensorFlow's and Keras' own containers have none
    grew.sort(key=lambda g: -g[0])
    where, unique = None, False
    best_bytes, best_n, best_numpy = 0, 0, False
    for best_bytes, best_n, best_numpy, holder in grew[:_HOLDER_TRIES]:  # noqa: B007  (the one found is kept)
        where, unique = _line_of_holder(holder, roots, site_files, script_dir)
        if where is not None:
            break
    del grew
    if where is None:
        return sites
    site = f"{os.path.basename(where[0])}:{where[1]}"
    if not unique and ambiguous is not None:
        ambiguous.add(site)
    if site in sites.sites:
        return sites  # tracemalloc or the tensor pass named it already
    code = linecache.getline(where[0], where[1]).strip()[:_MAX_CODE]
    rows = [(site, best_bytes, best_n, "numpy" if best_numpy else "python", code), *_rows(sites)]
    return _with_rows(sites, sorted(rows, key=lambda r: -r[1])[:TOP])


def _line_of_holder(holder: Any, roots: tuple[str, ...], site_files: list[str],
                    script_dir: str | None = None) -> tuple[tuple[str, int] | None, bool]:
    """(the script's line that adds to ``holder``, whether no other line could): the names it is
    bound to, from the script's running frames, its globals or an object they hold; the first line
    of the files the window saw growing, the running frames', the script's and its other modules'
    (under ``script_dir``, by default the script's folder) that adds to one of them."""
    files = list(site_files)
    frames = []
    for top in sys._current_frames().values():
        frame: Any = top
        while frame is not None:
            name = frame.f_code.co_filename
            if not name.startswith(roots) and not name.startswith("<") and name != __file__:
                files.append(name)
                frames.append(frame)
            frame = frame.f_back
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if main:
        files.append(os.path.abspath(main))
    under = script_dir if script_dir is not None else os.path.dirname(os.path.abspath(main)) if main else None
    modules, complete = _script_modules(roots, under) if under else ([], True)
    files += modules
    try:
        first, every = _names(holder, frames)
        where, unique = _adding_line(first, list(dict.fromkeys(files)), every)
        return where, unique and complete
    finally:
        del frames


_MAX_MODULES = 50  # the script's own modules searched for a line that adds to a name
# (len(sys.modules), the folder, its modules' files, all of them): read once while no module is added
_modules_seen: tuple[int, str, list[str], bool] = (0, "", [], True)


def _script_modules(roots: tuple[str, ...], under: str) -> tuple[list[str], bool]:
    """(the files of the modules imported from the folder ``under`` (the script's own) and
    outside the libraries, at most ``_MAX_MODULES``; whether that is all of them). Each module's
    own ``__dict__`` is read, never an attribute: a lazily loaded module (TensorFlow's
    ``LazyLoader``, importlib's) would import on this thread."""
    global _modules_seen
    n = len(sys.modules)
    under = os.path.join(os.path.abspath(under), "")
    if _modules_seen[0] == n and _modules_seen[1] == under:
        return _modules_seen[2], _modules_seen[3]
    out: list[str] = []
    complete = True
    for m in list(sys.modules.values()):  # a copy: the script may import meanwhile
        if not isinstance(m, types.ModuleType):
            continue
        try:
            f = object.__getattribute__(m, "__dict__").get("__file__")
        except Exception:  # noqa: BLE001  (a module object of some other making: left out)
            continue
        if isinstance(f, str) and f.endswith(".py"):
            f = os.path.abspath(f)
            if f.startswith(under) and not f.startswith(roots) and f != __file__:
                if len(out) >= _MAX_MODULES:
                    complete = False
                    break
                out.append(f)
    _modules_seen = (n, under, out, complete)
    return out, complete


def _with_tensors(sites: AllocationSites, before: tuple[type, int] | None, roots: tuple[str, ...],
                  site_files: list[str], ambiguous: set[str] | None = None,
                  script_dir: str | None = None) -> AllocationSites:
    """``sites`` with the eager tensors that grew in the window charged to the line that keeps
    them (first: tensors are what a step's allocations are when the script keeps them); a line
    that is the first of several adding to the holder's names goes into ``ambiguous``."""
    if before is None:
        return sites
    t, mark = before
    new, containers = [], []
    for o in heap.objects_of((t, list, dict, deque)):  # one pass: the new tensors and their possible holders
        tp = type(o)
        if tp is t:
            if o._id > mark:
                new.append(o)
        elif (tp is list or tp is dict or tp is deque) and len(o) >= _HOLDER_SAMPLE and o is not new:
            containers.append(o)  # (``new`` itself is among the objects: it was made before them)
    grown, scalars = _tensor_bytes(new)
    if grown < _MIN_SITE_BYTES and len(new) < _MIN_TENSORS:
        return sites
    count = len(new)
    stride = max(1, len(new) // _HOLDER_SAMPLE)
    sample = new[::stride][:_HOLDER_SAMPLE]
    del new
    big = [c for c in containers if len(c) >= count // 4]
    holder = _holder(big, sample)
    del containers, big, sample
    where, unique = (_line_of_holder(holder, roots, site_files, script_dir) if holder is not None
                     else (None, False))
    site = f"{os.path.basename(where[0])}:{where[1]}" if where else ""
    if site and not unique and ambiguous is not None:
        ambiguous.add(site)
    code = linecache.getline(where[0], where[1]).strip()[:_MAX_CODE] if where else ""
    kind = "scalar tensors" if scalars else "tensors"
    rows = [(site, grown, count, kind, code)] + [
        row for row in _rows(sites)
        if not site or row[0] != site]  # the line's own Python growth (the list's array) is in the tensors'
    return _with_rows(sites, sorted(rows, key=lambda r: -r[1])[:TOP])


def install(agent: "Agent", patches: "Patches") -> LeakDoctor | None:
    """Registers the doctor's sampler (patches nothing); None where RSS cannot be read cheaply."""
    rss = proc_stats.rss_reader()
    if rss is None:
        return None
    pm = getattr(agent, "pipeline_map", None)
    rp = getattr(agent, "retrace_probe", None)
    counts = getattr(rp, "_traces", None)  # the retrace probe's traces per function name
    doctor = LeakDoctor(agent, rss, held=(lambda: pm.held_bytes) if pm is not None else (lambda: 0),
                        traces=(lambda: sum(counts.values())) if counts is not None else (lambda: 0))
    agent.add_sampler(PROBE, doctor)
    agent.on_shutdown(doctor.close)
    return doctor

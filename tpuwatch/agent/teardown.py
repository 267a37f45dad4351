"""TensorFlow's iterator teardown: a long pause while a tf.data iterator is deleted.

Deleting a tf.data iterator joins tf.data's own threads: its autotune thread (which sleeps for
its optimization period and is not always woken at once), a prefetch, a map element still being
computed (a ``tf.numpy_function`` cannot be cancelled). The training thread waits in C++ with
no Python frame of TensorFlow's on its stack (the iterator's resource is a tensor handle freed
as its last reference drops): a sampled stack shows only the line that dropped it (``del it``,
the end of a ``for x in ds:`` loop, Keras' epoch iterator, the script's end).

So the probe times the deletion itself, on the thread that drops the iterator: when an
``OwnedIterator`` or ``OwnedMultiDeviceIterator`` is made, it gets a ``weakref.finalize``
(called as its last reference drops, before its attributes are freed) and one attribute set
last, whose ``__del__`` runs after the resource attribute set before it is freed (CPython frees
an instance's attributes in its dict's key order: for instances that share their class's key
table, the order the first instance set them; an iterator rebuilt from its components, which
sets ``_components`` after, ends its timing early: missed, never misnamed). Both cost a clock
read, once per iterator. A deletion whose end never comes (a copy of the iterator shares that
attribute) is dropped once a step runs.
A deletion on the training thread with no step call under way that lasts at least
:data:`LONG_S` becomes one :class:`~tpuwatch.protocol.Teardown`, with the process's CPU time
over it and the training thread's stack that the agent's thread sampled during it. The ledger
books those seconds as *iterator teardown* instead of *host between steps* or *finishing*.

An iterator freed by the cycle collector runs both callbacks before its resource is freed: that
deletion is not timed (missed, never misnamed).
"""

from __future__ import annotations

import itertools
import linecache
import os
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable

from tpuwatch.agent import clocks
from tpuwatch.agent.script_frames import innermost, library_roots
from tpuwatch.protocol import Teardown

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.patches import Patches

PROBE = "teardown"
#: A deletion at least this long (seconds) is reported.
LONG_S = 2.0
#: Seconds between two reports of a deletion still under way.
PROGRESS_EVERY_S = 1.0
#: A thread that used the CPU for more than this share of the time since the deletion's first look
#: is not inside it (a deletion waits for tf.data's threads, idle).
BUSY_FRAC = 0.25
#: Frames of the training thread's stack kept, innermost first.
MAX_FRAMES = 6
_MAX_CODE = 120
#: (module, class): iterators whose deletion is timed (a distributed iterator holds the second,
#: which holds one of the first per device: only the outermost deletion counts).
ITERATORS: tuple[tuple[str, str], ...] = (
    ("tensorflow.python.data.ops.iterator_ops", "OwnedIterator"),
    ("tensorflow.python.data.ops.multi_device_iterator_ops", "OwnedMultiDeviceIterator"),
)
_ATTR = "_tpuwatch_teardown_end"
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def frame_line(f: Any) -> str:
    """``file.py:48 in main: del it``."""
    code = f.f_code
    text = linecache.getline(code.co_filename, f.f_lineno).strip()[:_MAX_CODE]
    return f"{os.path.basename(code.co_filename)}:{f.f_lineno} in {code.co_name}" + (f": {text}" if text else "")


def stack_lines(frame: Any, limit: int = MAX_FRAMES) -> tuple[str, ...]:
    """One :func:`frame_line` per frame, innermost first; tpuwatch's frames and frozen modules'
    (runpy, which runs the script) left out."""
    out: list[str] = []
    f = frame
    while f is not None and len(out) < limit:
        path = f.f_code.co_filename
        if not path.startswith(_OWN_DIR) and not path.startswith("<frozen ") and os.path.basename(path) != "runpy.py":
            out.append(frame_line(f))
        f = f.f_back
    return tuple(out)


class _End:
    """Set last on an iterator: freed after its resource, so its ``__del__`` is the deletion's end."""

    __slots__ = ("probe", "key")

    def __init__(self, probe: "TeardownProbe", key: int) -> None:
        self.probe = probe
        self.key = key

    def __del__(self) -> None:
        self.probe.end(self.key)


class TeardownProbe:
    """Times iterator deletions on the training thread; samples its stack during a long one."""

    def __init__(self, agent: "Agent", thread: int | None = None, long_s: float = LONG_S,
                 wall: Callable[[], float] = clocks.wall, cpu: Callable[[], float] = time.process_time,
                 in_step: Callable[[], bool] | None = None) -> None:
        self.agent = agent
        self.long_s = long_s
        self._thread = thread if thread is not None else threading.main_thread().ident
        self._wall = wall
        self._cpu = cpu
        self._in_step = in_step if in_step is not None else self._agent_in_step
        self.enabled = True
        self._keys = itertools.count()
        # the iterator whose deletion is timed (the outermost: a distributed iterator's own
        # iterators are freed inside it); an end that never came leaves the rest untimed, never
        # misnamed
        self._outer: int | None = None
        self._since: float | None = None  # unix time the outermost deletion under way began
        self._step0 = 0  # the agent's step count when it began: a step since means it is over
        self._cpu0 = 0.0
        self._iterator = ""
        self._token = 0  # counts the deletions timed
        self._stack: tuple[str, ...] = ()
        self._site = ""
        self._stack_token = -1  # the deletion _stack and _site were sampled in
        self._roots: tuple[str, ...] | None = None
        self._next_progress = 0.0
        self._where: tuple[Any, int] | None = None  # the training thread's top frame (code, f_lasti) seen
        self._where_token = -1  # the deletion _where was seen in
        self._where_cpu: tuple[float, float] | None = None  # (wall, the training thread's CPU) then
        self.timed = 0  # deletions timed (tests)

    def _agent_in_step(self) -> bool:
        probe = self.agent.step_probe
        return probe is not None and probe.trace.current_top is not None

    # --- the thread that drops an iterator -----------------------------------------------------

    def created(self, iterator: Any) -> None:
        """An iterator was made: its deletion will be timed."""
        key = next(self._keys)
        fin = weakref.finalize(iterator, self.begin, type(iterator).__name__, key)
        fin.atexit = False  # at interpreter exit nothing is deleted by it
        object.__setattr__(iterator, _ATTR, _End(self, key))

    def begin(self, iterator: str, key: int) -> None:
        try:
            if not self.enabled or threading.get_ident() != self._thread or self._outer is not None:
                return
            if self._in_step():
                return  # inside a step call: step time, not a pause between steps
            self._outer = key
            self._step0 = self.agent.global_step
            self._token += 1
            self._iterator = iterator
            self._cpu0 = self._cpu()
            self._since = self._wall()
        except Exception as e:  # never into the script (this runs as its iterator is freed)
            self._fail(e)

    def end(self, key: int) -> None:
        try:
            if key != self._outer:
                return
            self._outer = None
            since = self._since
            self._since = None
            if since is None or not self.enabled or threading.get_ident() != self._thread:
                return
            now = self._wall()
            self.timed += 1
            if now - since < self.long_s:
                return
            sampled = self._stack_token == self._token
            self.agent.emit(Teardown(t=now, since=since, cpu_s=max(0.0, self._cpu() - self._cpu0),
                                     iterator=self._iterator, step=self.agent.global_step,
                                     stack=self._stack if sampled else (), site=self._site if sampled else ""))
        except Exception as e:  # never into the script
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        self.enabled = False
        try:
            self.agent.probe_failed(PROBE, e)
        except Exception:  # noqa: S110 - the agent itself is gone (interpreter exit): nothing to tell
            pass

    # --- the agent's thread --------------------------------------------------------------------

    def __call__(self) -> list[Teardown]:
        """A sampler: while a deletion is under way, the training thread's stack, once; past
        :data:`LONG_S`, a Teardown ``under_way`` every :data:`PROGRESS_EVERY_S`."""
        token = self._token
        since = self._since
        if since is None or not self.enabled:
            return []
        if self.agent.global_step != self._step0 or self._moved_on(token):
            # A step ran since it began, or the training thread is not blocked where it was (a
            # thread inside the deletion waits in C, its Python frames still): it is not inside
            # it, and its end never came (a copy of the iterator shares the attribute whose
            # freeing ends it; an evaluation's loop, with no training step, went on meanwhile).
            # Left untimed, never reported as a pause that goes on.
            if self._token == token:
                self._outer = self._since = None
            return []
        if self._stack_token != token:
            self._sample_stack(token)
        now = self._wall()
        if now - since < self.long_s or now < self._next_progress:
            return []
        self._next_progress = now + PROGRESS_EVERY_S
        cpu_s = max(0.0, self._cpu() - self._cpu0)
        if self._since != since or self._token != token:
            return []  # it ended meanwhile: its own message says so
        sampled = self._stack_token == token
        return [Teardown(t=now, since=since, cpu_s=cpu_s, iterator=self._iterator, step=self.agent.global_step,
                         stack=self._stack if sampled else (), site=self._site if sampled else "", under_way=True)]

    def _moved_on(self, token: int) -> bool:
        """Whether the training thread runs on: its innermost Python frame, or its place in it,
        changed since the first look during this deletion, or it used the CPU for more than
        :data:`BUSY_FRAC` of the time since (a thread inside a deletion waits, idle)."""
        frame = sys._current_frames().get(self._thread)  # type: ignore[arg-type]
        where = (frame.f_code, frame.f_lasti) if frame is not None else None
        del frame
        cpu = self._thread_cpu()
        now = self._wall()
        if self._where_token != token:
            self._where, self._where_token = where, token
            self._where_cpu = (now, cpu) if cpu is not None else None
            return False
        if where != self._where:
            return True
        if cpu is not None and self._where_cpu is not None:
            wall0, cpu0 = self._where_cpu
            return now - wall0 > 0 and (cpu - cpu0) > BUSY_FRAC * (now - wall0)
        return False

    def _thread_cpu(self) -> float | None:
        """The training thread's CPU seconds (Linux; None where a thread's clock cannot be read)."""
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(self._thread))  # type: ignore[arg-type]
        except (AttributeError, OSError, OverflowError, TypeError):
            return None

    def _sample_stack(self, token: int) -> None:
        if self._roots is None:
            self._roots = library_roots()
        frame = sys._current_frames().get(self._thread)  # type: ignore[arg-type]
        try:
            lines = stack_lines(frame)
            script, _inside = innermost(frame, self._roots)
            site = frame_line(script) if script is not None and not script.f_code.co_filename.startswith(_OWN_DIR) else ""
            del script, _inside
        finally:
            del frame  # a frame keeps every local of the training thread alive
        if self._since is not None and self._token == token:
            self._stack, self._site = lines, site
            self._stack_token = token  # set after them: end() reads the token first


def install(agent: "Agent", patches: "Patches") -> TeardownProbe:
    """Patches the iterators' ``__init__`` as their modules are imported; samples the stack."""
    from tpuwatch.agent import post_import

    probe = TeardownProbe(agent)

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            if probe.enabled:
                try:
                    probe.created(self)
                except Exception as e:  # never into the script: its iterator is made all the same
                    probe._fail(e)

        return wrapper

    def patcher(cls_name: str) -> Callable[[Any], None]:
        def patch(module: Any) -> None:
            cls = getattr(module, cls_name, None)
            if cls is not None and "__init__" in vars(cls):
                patches.wrap(cls, "__init__", make)

        return patch

    for module, cls_name in ITERATORS:
        post_import.when_imported(module, patcher(cls_name), lambda e: agent.probe_failed(PROBE, e))
    agent.add_sampler(PROBE, probe)

    def stop() -> None:
        probe.enabled = False  # iterators freed after the exit record are not the run's

    agent.on_shutdown(stop)
    return probe

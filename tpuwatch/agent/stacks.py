"""Stack dumps of the training process, for runs that stall or hang.

Three ways in, because a hang can be of two kinds and nobody may be watching:

* the ``stack_dump`` command (registered with ``at_step_boundary=False``): it runs on the
  transport's server thread, so it answers while the training thread is stuck in a collective,
  an input pipeline, a sleep or a Python loop. It formats every thread's stack
  (``sys._current_frames``), marks the training (main) thread, writes
  ``<run_dir>/stacks/<timestamp>.txt``, emits a :class:`~tpuwatch.protocol.StackDump` and
  returns the path.
* ``faulthandler`` on SIGUSR1, for a hang inside C code that holds the GIL (no Python thread,
  the server's included, can run then): the C-level handler still writes every thread's
  Python stack to ``<run_dir>/stacks/faulthandler.txt``. ``tpuwatch`` sends SIGUSR1 when the
  command gets no answer. Installed only when the script has not claimed SIGUSR1 itself.
* :class:`StallStacks`, on the agent's thread at the sample rate: when no step has come for the
  stall limit (:func:`stall_limit_s`) while the process is alive and doing nothing that
  progresses (a save, an evaluation, a new iterator), it takes every thread's stack once per
  stall, names what the training thread waits in (:func:`describe`) and emits a
  :class:`~tpuwatch.protocol.StackDump` with ``reason="stall"``, so the evidence is there while
  the hang lasts, with no key pressed. It learns the step cadence from :attr:`Agent.step_taps`
  (the agent's thread): nothing runs on the training thread.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Sequence

from tpuwatch import rundir, settings
from tpuwatch.agent.script_frames import is_script, library_roots
from tpuwatch.protocol import Command, Message, StackDump

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.patches import Patches

#: Sub-directory of the run directory the dumps go to.
STACKS_DIR = "stacks"
#: The file faulthandler appends to on SIGUSR1.
FAULTHANDLER_FILE = "faulthandler.txt"
#: The StackDump message carries at most this much text (the file has all of it).
MAX_MESSAGE_CHARS = 200_000
#: A thread's stack is cut to its innermost frames beyond this many.
MAX_FRAMES = 200


def format_stacks(current: int | None = None, *, step: int | None = None,
                  clock: Callable[[], float] = time.time, frames: dict[int, Any] | None = None,
                  thread_notes: dict[int, str] | None = None) -> str:
    """Every thread's Python stack, the training (main) thread first and marked.

    ``current``: the ident of the thread doing the dump (marked as such, since its own frames
    are the dump's, not the program's). ``frames``: ``sys._current_frames()`` taken already;
    ``thread_notes``: a line to add under a thread's frames (what runs below them).
    """
    frames = sys._current_frames() if frames is None else frames
    threads = {t.ident: t for t in threading.enumerate()}
    main_ident = threading.main_thread().ident
    order = sorted(frames, key=lambda ident: (ident != main_ident, threads.get(ident) is None,
                                              getattr(threads.get(ident), "name", "")))
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(clock()))
    head = f"tpuwatch stack dump: pid {os.getpid()}, {when}"
    if step is not None:
        head += f", global step {step}"
    out = [head, f"{len(frames)} threads; the training thread is the main thread", ""]
    for ident in order:
        thread = threads.get(ident)
        name = thread.name if thread is not None else "(not a threading.Thread)"
        notes = []
        if ident == main_ident:
            notes.append("TRAINING THREAD")
        if ident == current:
            notes.append("this dump")
        elif name.startswith("tpuwatch-"):
            notes.append("tpuwatch")
        if thread is not None and thread.daemon:
            notes.append("daemon")
        label = f" [{', '.join(notes)}]" if notes else ""
        out.append(f'Thread "{name}" (ident {ident}){label}, most recent call last:')
        stack: list[traceback.FrameSummary] = traceback.extract_stack(frames[ident])
        if len(stack) > MAX_FRAMES:
            out.append(f"  ... {len(stack) - MAX_FRAMES} outer frames left out ...")
            stack = stack[-MAX_FRAMES:]
        out.extend(line.rstrip("\n") for line in traceback.format_list(stack))
        if thread_notes and ident in thread_notes:
            out.append(f"  {thread_notes[ident]}")
        out.append("")
    del frames  # frames keep every local of every thread alive
    return "\n".join(out)


class StackDumper:
    """The ``stack_dump`` command handler, and the SIGUSR1 faulthandler file."""

    def __init__(self, agent: "Agent") -> None:
        self.agent = agent
        self.dir = Path(agent.run_dir) / STACKS_DIR
        self._fault_file: IO[str] | None = None

    def _ensure_dir(self) -> Path:
        self.dir.mkdir(mode=0o700, exist_ok=True)
        return self.dir

    def dump(self, cmd: Command) -> tuple[str | None, dict[str, Any]]:
        text = format_stacks(threading.get_ident(), step=self.agent.global_step, clock=self.agent.clock)
        path = self.write(f"{cmd.id[:16] or 'dump'}", text)
        self.agent.emit(StackDump(t=self.agent.clock(), text=shown_text(text, path), path=str(path)))
        return f"stack dump written to {path}", {"path": str(path)}

    def write(self, name: str, text: str) -> Path:
        """``text`` into ``stacks/<timestamp>-<name>.txt``; its path."""
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.agent.clock()))
        path = self._ensure_dir() / f"{stamp}-{name}.txt"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)  # never through a link
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return path

    def install_faulthandler(self) -> bool:
        """Registers faulthandler on SIGUSR1 unless the script or Python already handles it."""
        if not hasattr(signal, "SIGUSR1"):
            return False
        if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
            return False
        path = self._ensure_dir() / FAULTHANDLER_FILE
        fd = rundir.open_append(path)
        # Kept open for the life of the process: faulthandler writes to its fd from a C handler.
        self._fault_file = os.fdopen(fd, "a")
        faulthandler.register(signal.SIGUSR1, file=self._fault_file, all_threads=True, chain=False)
        return True

    def uninstall(self) -> None:
        if self._fault_file is not None:
            faulthandler.unregister(signal.SIGUSR1)
            self._fault_file.close()
            self._fault_file = None


def shown_text(text: str, path: Path) -> str:
    """What a StackDump message carries of ``text`` (the file at ``path`` has all of it)."""
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + f"\n... cut; all of it in {path}\n"


# --- what a stalled training thread waits in ------------------------------------------------------

#: The live stall limit's floor and its multiple of the median step interval, the cadence limit's
#: floor and its multiple of the p95 interval: the viewer's stall rule's defaults, so the stacks
#: are there by the time a viewer calls the gap a stall.
LIVE_MIN_S = 60.0
CADENCE_MIN_S = 10.0
LIVE_MEDIAN_FACTOR = 20.0
CADENCE_P95_FACTOR = 300.0
#: Step intervals the limit is learned from (the newest).
INTERVALS_KEPT = 101
#: Phases in which the process progresses though no step comes (the stall rule's too).
PROGRESSING = frozenset({"checkpointing", "iterator", "evaluating", "starting", "finishing"})

_SEP = os.sep
#: Files of TensorFlow's whose frames mean the thread waits for a batch of the input pipeline.
_ITERATOR_FILES = ("iterator_ops.py", "input_lib.py", "multi_device_iterator_ops.py")
#: ... runs a step (a tf.function's call, an op, a tensor's value): below it, native code.
_STEP_FILES = ("polymorphic_function.py", "concrete_function.py", "execute.py", "atomic_function.py")
_STEP_FUNCTIONS = frozenset({"_numpy", "numpy", "__float__", "__int__", "__bool__", "__index__"})
#: ... runs Python for tf.data (``from_generator``, ``py_function``, ``numpy_function``).
_PY_FUNC_FILES = ("script_ops.py", "from_generator_op.py")


def stall_limit_s(intervals: Sequence[float], floor_s: float) -> float:
    """Seconds without a step after which the stacks are taken: the run's own cadence
    (``CADENCE_P95_FACTOR`` x p95 interval, at least ``floor_s``), never more than the live limit
    (``LIVE_MIN_S``, or ``LIVE_MEDIAN_FACTOR`` x the median interval); with fewer than 5 intervals
    known, the live limit (or ``floor_s`` if that is more)."""
    live = LIVE_MIN_S
    if len(intervals) < 5:
        return max(live, floor_s)
    ordered = sorted(intervals)
    n = len(ordered)
    med = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    p95 = ordered[min(n - 1, int(round(0.95 * (n - 1))))]
    live = max(live, LIVE_MEDIAN_FACTOR * med)
    return min(live, max(floor_s, CADENCE_P95_FACTOR * p95))


@dataclass(frozen=True)
class Where:
    """What one thread waits in, from its stack (outermost frame first)."""

    stalled_in: str  # script | input | step | tensorflow | "" (no frame of the script's)
    headline: str
    native_note: str = ""  # said under the thread's frames when native code runs below them


def _line(frame: traceback.FrameSummary) -> str:
    code = (frame.line or "").strip()
    where = f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return f"{where}: {code}" if code else where


def _in_tf(frame: traceback.FrameSummary) -> bool:
    path = frame.filename
    return f"{_SEP}tensorflow{_SEP}" in path or f"{_SEP}keras{_SEP}" in path or f"{_SEP}tf_keras{_SEP}" in path


def describe(stack: Sequence[traceback.FrameSummary], roots: tuple[str, ...]) -> Where:
    """What the thread whose ``stack`` this is waits in, in one line."""
    inner = next((i for i in range(len(stack) - 1, -1, -1) if is_script(stack[i].filename, roots)), None)
    if inner is None:
        if not stack:
            return Where("", "")
        return Where("", f"in {stack[-1].name} ({os.path.basename(stack[-1].filename)}:{stack[-1].lineno}); "
                         "no frame of the script's")
    below = stack[inner + 1:]
    line = _line(stack[inner])
    if not below or not any(_in_tf(f) for f in below):
        # the script's own Python (a sleep, a lock, a queue, a socket: the standard library's frames)
        return Where("script", f"waiting at {line}")
    native = "[native] below this frame TensorFlow's C++ runs; Python shows no frame there"
    if any(f.filename.endswith(_ITERATOR_FILES) for f in below):
        return Where("input", f"waiting for the next batch of the input pipeline at {line}", native)
    if any(f.filename.endswith(_STEP_FILES) or (_in_tf(f) and f.name in _STEP_FUNCTIONS) for f in below):
        return Where("step", f"inside the step called at {line} (TensorFlow's native code: a collective, "
                             "an in-graph input fetch or the computation)", native)
    return Where("tensorflow", f"in TensorFlow or Keras under {line} ({below[-1].name})", native)


def pipeline_line(stack: Sequence[traceback.FrameSummary], roots: tuple[str, ...]) -> str:
    """The innermost line of the script's in a thread that runs Python for tf.data ("" if none)."""
    if not any(f.filename.endswith(_PY_FUNC_FILES) for f in stack):
        return ""
    inner = next((f for f in reversed(stack) if is_script(f.filename, roots)), None)
    return _line(inner) if inner is not None else ""


def _setting_s() -> float | None:
    raw = settings.STALL_STACKS_S.get().strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value > 0 else None


class StallStacks:
    """Takes every thread's stack once per stall (agent thread): a step tap and a sampler."""

    def __init__(self, agent: "Agent", dumper: StackDumper, floor_s: float = CADENCE_MIN_S,
                 fixed_s: float | None = None) -> None:
        """``fixed_s``: take the stacks after this many seconds whatever the cadence (default:
        ``TPUWATCH_STALL_STACKS_S`` when set)."""
        self.agent = agent
        self.dumper = dumper
        self.floor_s = floor_s
        self.fixed_s = fixed_s if fixed_s is not None else _setting_s()
        self.intervals: deque[float] = deque(maxlen=INTERVALS_KEPT)
        self.last_t: float | None = None  # unix time of the newest step record
        self.last_step = 0
        self.taken_after: int | None = None  # the step whose stall has its stacks
        self._progress_t = 0.0  # the latest time a phase that progresses was seen

    def tap(self, steps: list[tuple[Any, ...]]) -> None:
        """The Steps' fields (step, t, ...) one drain wrote, on the agent's thread."""
        last_t, intervals = self.last_t, self.intervals
        for fields in steps:
            step, t = fields[0], fields[1]
            if last_t is not None and t >= last_t:
                intervals.append(t - last_t)
            last_t = t
        self.last_t, self.last_step = last_t, step

    def __call__(self) -> list[Message]:
        """The sampler: the stacks, when a stall has just reached the limit."""
        last_t = self.last_t
        if last_t is None or self.taken_after == self.last_step:
            return []
        now = self.agent.clock()
        phases = self.agent.phases
        if phases.current in PROGRESSING:
            self._progress_t = now
            return []
        start = max(last_t, self._progress_t)
        if phases.current == "host":
            start = max(start, phases.since)
        limit = self.fixed_s if self.fixed_s is not None else stall_limit_s(self.intervals, self.floor_s)
        if now - start < limit:
            return []
        self.taken_after = self.last_step
        return [self.take(now - last_t, limit)]

    def take(self, gap_s: float, limit_s: float) -> StackDump:
        """Every thread's stack now, and what the training thread and tf.data's threads wait in."""
        frames = sys._current_frames()
        try:
            roots = library_roots()
            main = threading.main_thread().ident
            own = {t.ident for t in threading.enumerate() if t.name.startswith("tpuwatch-")}
            where = Where("", "")
            notes: dict[int, str] = {}
            input_line = ""
            for ident, frame in frames.items():
                stack = traceback.extract_stack(frame)
                if ident == main:
                    where = describe(stack, roots)
                    if where.native_note:
                        notes[ident] = where.native_note
                elif ident not in own and not input_line:
                    input_line = pipeline_line(stack, roots)
            stalled_in = where.stalled_in
            if input_line and stalled_in in ("step", "input", "tensorflow"):
                stalled_in = "input"  # the step waits for a batch a Python stage of the pipeline holds
            head = [f"tpuwatch stall stacks: no step for {gap_s:.1f} s after step {self.last_step} "
                    f"(limit {limit_s:.1f} s); taken by the agent itself",
                    f"training thread: {where.headline or 'no Python frame'}"]
            if input_line:
                head.append(f"input pipeline (a thread of tf.data running the script's Python): {input_line}")
            text = "\n".join(head) + "\n\n" + format_stacks(threading.get_ident(), step=self.agent.global_step,
                                                             clock=self.agent.clock, frames=frames, thread_notes=notes)
        finally:
            del frames  # frames keep every local of every thread alive
        path = self.dumper.write(f"stall-after-step-{self.last_step}", text)
        return StackDump(t=self.agent.clock(), text=shown_text(text, path), path=str(path), reason="stall",
                         step=self.last_step, gap_s=round(gap_s, 2), headline=where.headline,
                         stalled_in=stalled_in, input_line=input_line)


def install(agent: "Agent", patches: "Patches") -> StackDumper:
    """Registers ``stack_dump`` (answered even while training hangs), the SIGUSR1 dump, and the
    stacks taken when a stall begins."""
    dumper = StackDumper(agent)
    agent.register("stack_dump", dumper.dump, at_step_boundary=False)
    stall = StallStacks(agent, dumper)
    agent.step_taps.append(("stacks", stall.tap))
    agent.add_sampler("stacks", stall)
    try:
        dumper.install_faulthandler()
    except (OSError, ValueError, RuntimeError) as e:
        # Not fatal: the command still works for hangs that let Python threads run.
        agent.event("warning", "probe:stacks", f"no SIGUSR1 stack dump: {type(e).__name__}: {e}")
    return dumper

"""Where the time between steps goes: the training thread's stack, sampled from the agent's thread.

:data:`SAMPLE_HZ` times a second while it finds the training thread between steps (else at the
agent's sample rate, ``TPUWATCH_SAMPLE_HZ``) the agent's thread reads the training (main) thread's
current frame (``sys._current_frames``) and, when the process is training and no step call is under
way (the step probe's ``current_top`` is None between top-level calls), charges the sample to the
innermost frame of the script's on that stack. Nothing runs on the training thread: no tracing
hook, no profiler, no per-step work; the step probe's attribute is only read. The counts go out as
:class:`~tpuwatch.protocol.HostSites` every few seconds while they change, and once more when the
script ends; the ``host-bound`` rule reads them beside the goodput ledger's *host between steps*.

What a sample says about its line (``kinds``): the library frames inside it and the line's
text (NumPy's C functions leave no Python frame, so ``np.`` on the line is NumPy's work);
where the line runs (``roles``): inside a generator of the script's (the batches are built in
Python; its consumer's line is kept), inside a Keras callback's method, or the loop itself.
"""

from __future__ import annotations

import inspect
import linecache
import os
import sys
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable

from tpuwatch.agent import clocks
from tpuwatch.agent.script_frames import innermost, is_script, library_roots
from tpuwatch.protocol import HostSites

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.patches import Patches

PROBE = "gap_sampler"
#: Looks a second at the training thread while recent looks find it between steps. The
#: host-bound rule wants a few samples between steps with most of them on one line: at the
#: agent's 4 Hz, the 1.5 s between steps of a 300-step fit whose callback reads the weights every
#: batch gave 1 to 7 samples, and the finding came and went from run to run; at 20 a second the
#: same run gave 9-36 in four runs. A look costs 2.5-7 µs of the agent thread
#: (`bench/gap_sampler_cost.py`), but the wake for it ~125 µs of CPU here: where the looks find
#: steps under way (a healthy run), the sampler looks at the agent's own rate.
SAMPLE_HZ = 20.0
#: One of the last :data:`RECENT` looks found the training thread between steps: look at
#: :data:`SAMPLE_HZ` (were the looks independent of where a step is: with 29 % of a run's time
#: between steps, ~9 looks in 10 are at that rate; with 2 %, ~1 in 7). Asking two of 8 left the
#: 300-step fit above at 4 Hz in one run of four (3 samples); one of 8 gave it 9-36 samples in
#: four runs.
RECENT = 8
#: Seconds between two HostSites messages while the counts change.
EMIT_EVERY_S = 5.0
#: Sites sent per message, most samples first.
TOP = 8
#: Distinct lines counted at most (past it, samples count in the totals only).
MAX_SITES = 256
#: Frames walked outward from the script's innermost one, looking for its generator or callback.
MAX_WALK = 64
_MAX_CODE = 160
#: Keras callback methods that run between steps.
CALLBACK_METHODS = frozenset({
    "on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end",
    "on_test_batch_begin", "on_test_batch_end", "on_predict_batch_begin", "on_predict_batch_end",
})
#: Functions of TensorFlow's and Keras' that copy a tensor back to the host.
_READS = frozenset({"numpy", "_numpy", "_numpy_internal", "get_weights", "convert_to_numpy", "_copy_to_host"})
_GENERATOR = inspect.CO_GENERATOR
_NUMPY_DIR = f"{os.sep}numpy{os.sep}"
_LOGGING_DIR = f"{os.sep}logging{os.sep}"
_KERAS_DIR = f"{os.sep}keras{os.sep}"
_TF_KERAS_DIR = f"{os.sep}tf_keras{os.sep}"
_KERAS_LOOPS = frozenset({"fit", "evaluate", "predict"})
_TF_DATA_DIR = os.sep.join(("", "tensorflow", "python", "data", ""))
_TF_INPUT_LIB = os.sep.join(("", "tensorflow", "python", "distribute", "input_lib"))


def kind_of(inside: list[Any], code: str) -> str:
    """What a sampled line spends its time on: "logging", "tensor read", "numpy" or "python".

    ``inside``: the library frames inside the script's line, innermost first; ``code`` its text."""
    if "print(" in code or "logging." in code or "logger." in code:
        return "logging"
    for f in inside:
        if f.f_code.co_name in _READS:
            return "tensor read"
    for f in inside:
        path = f.f_code.co_filename
        if _LOGGING_DIR in path:
            return "logging"
        if _NUMPY_DIR in path:
            return "numpy"
    if ".numpy()" in code or "get_weights(" in code:
        return "tensor read"
    if "np." in code or "numpy." in code:
        return "numpy"
    return "python"


def _in_keras_loop(f: Any) -> bool:
    """A frame of Keras' own training loop (the script's line is the ``fit`` call)."""
    code = f.f_code
    return code.co_name in _KERAS_LOOPS and (_KERAS_DIR in code.co_filename or _TF_KERAS_DIR in code.co_filename)


def _in_input_fetch(f: Any) -> bool:
    """A frame of tf.data's or tf.distribute's iterators (the next batch being fetched)."""
    path = f.f_code.co_filename
    return _TF_DATA_DIR in path or _TF_INPUT_LIB in path


def _qualname(code: Any) -> str:
    return str(getattr(code, "co_qualname", code.co_name))  # Python 3.11 on; the bare name before


def _written_in(code: Any) -> str | None:
    """For a generator expression, a comprehension or a lambda: the qualified name of the
    function it is written in (its own frame may have no caller left to walk to by the time the
    agent's thread reads it: a paused generator's has none)."""
    name = _qualname(code)
    if code.co_name.startswith("<") and ".<locals>." in name:
        return name.rsplit(".<locals>.", 1)[0]
    return None


def _site(f: Any) -> str:
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"


def role_of(script_frame: Any, roots: tuple[str, ...]) -> tuple[str, str, str]:
    """(role, function, caller) of the script's innermost frame: inside a generator of the
    script's (caller: the script's line that consumes it), inside a Keras callback method
    (caller: ``Class.method``), else the loop itself (its own function)."""
    f = script_frame
    for _ in range(MAX_WALK):
        if f is None:
            break
        code = f.f_code
        if is_script(code.co_filename, roots):
            if code.co_flags & _GENERATOR and not code.co_name.startswith("<"):  # not a genexpr
                consumer, _inside = innermost(f.f_back, roots)
                return "generator", _qualname(code), _site(consumer) if consumer is not None else ""
            if code.co_name in CALLBACK_METHODS:
                return "callback", _qualname(code), _qualname(code)
            outer = _written_in(code)
            if outer is not None and outer.rsplit(".", 1)[-1] in CALLBACK_METHODS:
                return "callback", outer, outer
        f = f.f_back
    return "loop", _written_in(script_frame.f_code) or _qualname(script_frame.f_code), ""


class _Site:
    __slots__ = ("count", "kinds", "role", "function", "caller", "code")

    def __init__(self, role: str, function: str, caller: str, code: str) -> None:
        self.count = 0
        self.kinds: Counter[str] = Counter()
        self.role = role
        self.function = function
        self.caller = caller
        self.code = code


class GapSampler:
    """Samples the training thread between step calls (a sampler of the agent's thread).

    ``state`` says what the training thread does now: "gap" (training, between step calls),
    "step" (a step call under way) or "off" (not training: starting, evaluating, saving...)."""

    def __init__(self, agent: "Agent", state: Callable[[], str] | None = None,
                 step: Callable[[], int] | None = None, thread: int | None = None,
                 clock: Callable[[], float] = clocks.monotonic) -> None:
        self.agent = agent
        self._state = state if state is not None else self._agent_state
        self._step = step if step is not None else (lambda: agent.global_step)
        self._thread = thread if thread is not None else threading.main_thread().ident
        self._clock = clock
        self._roots: tuple[str, ...] | None = None
        self._sites: dict[tuple[str, int], _Site] = {}
        self.samples = 0
        self.script_samples = 0
        self.step_samples = 0
        # The samples of the gap under way, charged once a step ends it: the time after the last
        # step (fit's teardown, the script's own end) is not time between steps.
        self._pending: Counter[tuple[tuple[str, int], str]] = Counter()
        self._pending_samples = 0
        self._pending_script = 0
        self._gap_step = -1  # the step the gap under way follows
        self._sent = (0, 0)  # (samples, step_samples) at the last message
        self._next_emit = 0.0
        self._lock = threading.Lock()  # the agent thread's samples vs close() at the script's end
        self.interval_s = min(1.0 / SAMPLE_HZ, agent.sample_interval_s)
        self._fast_looks_left = 0  # RECENT after a look that found the thread between steps, then one fewer a look
        self._last_look = 0.0
        self._gap_looks = 0  # looks that found the thread between steps, after an earlier look
        self._gap_spacing_s = 0.0  # the time from the look before each of those to it, summed

    def _agent_state(self) -> str:
        agent = self.agent
        probe = agent.step_probe
        if probe is None or agent.global_step <= 0 or agent.phases.current not in ("training", "host"):
            return "off"
        return "step" if probe.trace.current_top is not None else "gap"

    def __call__(self) -> list[HostSites]:
        with self._lock:
            self.sample()
            now = self._last_look
            if now < self._next_emit:
                return []
            self._next_emit = now + EMIT_EVERY_S
            return self._message()

    def next_look_s(self) -> float:
        """Seconds to the next look: :data:`SAMPLE_HZ`'s while recent looks found the training
        thread between steps, else the agent's sample period."""
        if self._fast_looks_left:
            return self.interval_s
        return self.agent.sample_interval_s

    def sample(self) -> None:
        """One look at the training thread (on the agent's thread)."""
        before, self._last_look = self._last_look, self._clock()
        state = self._state()
        step = self._step()
        if state == "gap":
            self._fast_looks_left = RECENT
            if before:
                self._gap_looks += 1
                self._gap_spacing_s += self._last_look - before
        elif self._fast_looks_left:
            self._fast_looks_left -= 1
        if step != self._gap_step:
            self._commit()  # a step ended the gap: its samples were time between steps
            self._gap_step = step
        if state == "off":
            return
        if state == "step":
            self.step_samples += 1
            return
        frame = sys._current_frames().get(self._thread)  # type: ignore[arg-type]
        if frame is None:
            return
        try:
            self._charge(frame)
        finally:
            del frame  # a frame keeps every local of the training thread alive

    def _charge(self, frame: Any) -> None:
        self._pending_samples += 1
        if self._roots is None:
            self._roots = library_roots()
        roots = self._roots
        sf, inside = innermost(frame, roots)
        if sf is None or any(_in_keras_loop(f) or _in_input_fetch(f) for f in inside):
            # Keras' or TensorFlow's own code between steps: fit's loop, its progress bar, the
            # fetch of the next batch (a custom loop's `for x in dist_ds`: input, not the script's)
            return
        self._pending_script += 1
        key = (sf.f_code.co_filename, sf.f_lineno)
        site = self._sites.get(key)
        if site is None:
            if len(self._sites) >= MAX_SITES:
                return
            code = linecache.getline(key[0], key[1]).strip()[:_MAX_CODE]
            site = self._sites[key] = _Site(*role_of(sf, roots), code)
        self._pending[(key, kind_of(inside, site.code))] += 1

    def _commit(self) -> None:
        self.samples += self._pending_samples
        self.script_samples += self._pending_script
        for (key, kind), n in self._pending.items():
            site = self._sites[key]
            site.count += n
            site.kinds[kind] += n
        self._pending.clear()
        self._pending_samples = self._pending_script = 0

    def _message(self) -> list[HostSites]:
        if (self.samples, self.step_samples) == self._sent or not self.samples:
            return []
        self._sent = (self.samples, self.step_samples)
        top = sorted(((k, s) for k, s in self._sites.items() if s.count), key=lambda kv: -kv[1].count)[:TOP]
        return [HostSites(
            t=self.agent.clock(), samples=self.samples, script_samples=self.script_samples,
            step_samples=self.step_samples, sample_interval_s=self._mean_interval_s(),
            sites=tuple(f"{os.path.basename(path)}:{line}" for (path, line), _ in top),
            counts=tuple(s.count for _, s in top),
            kinds=tuple(s.kinds.most_common(1)[0][0] for _, s in top),
            roles=tuple(s.role for _, s in top), functions=tuple(s.function for _, s in top),
            callers=tuple(s.caller for _, s in top), code=tuple(s.code for _, s in top))]

    def _mean_interval_s(self) -> float:
        """The mean spacing of the samples between steps: from the look before each to it (the
        pace follows what the looks find)."""
        if not self._gap_looks:
            return self.agent.sample_interval_s
        return round(self._gap_spacing_s / self._gap_looks, 4)

    def close(self) -> None:
        """The script has ended: the last counts, if they changed since the last message (the
        samples after the last step are left out, as the ledger books that time *finishing*)."""
        with self._lock:
            for msg in self._message():
                self.agent.emit(msg)


def install(agent: "Agent", patches: "Patches") -> GapSampler:
    """Registers the sampler on the agent's thread, looking as often as it asks (patches nothing)."""
    sampler = GapSampler(agent)
    agent.add_sampler(PROBE, sampler, every_s=sampler.next_look_s)
    agent.on_shutdown(sampler.close)
    return sampler

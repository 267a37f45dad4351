"""The ``profile`` command: capture the next N training steps (or M milliseconds) with the TF profiler.

Execution: the command is queued on receipt and starts on the training thread at the
next step boundary with ``tf.profiler.experimental.start(logdir)`` (~0.1 ms). While it runs,
every step call is wrapped in ``tf.profiler.experimental.Trace("train", step_num=n, _r=1)``
through ``StepProbe.step_context``: those are the step markers XProf needs for its per-step
breakdown (without them its overview says "No step marker observed"). When the N-th step has
returned (or ``ms`` have passed: checked at each step boundary, and by a timer for a run that
makes no progress) the capture stops.

``stop()`` collects and writes the trace (30-350 ms measured). It runs on a helper thread, not on
the training thread: the next step starts at once instead of waiting for the export, and the
profile's step markers are already closed (the next step gets none), so XProf sees exactly the
captured steps. A ``gs://`` logdir is captured into the run directory, then uploaded from that
same helper thread. The one Result is sent when everything is on its destination.

Layout (TensorBoard/XProf): ``<logdir>/plugins/profile/<timestamp>/<host>.xplane.pb``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager

from tpuwatch.agent import clocks, destinations
from tpuwatch.agent.agent_api import CommandRefused
from tpuwatch.protocol import AUTO_PROFILE_ID_PREFIX, Command

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent

DEFAULT_STEPS = 5
MAX_STEPS = 1000
MAX_MS = 600_000.0
#: A steps capture that has not seen its N steps after this long stops with what it has
#: (a stalled run; the partial profile shows what the process was doing). Arg ``max_s``.
DEFAULT_MAX_S = 120.0
#: The timer gives a step in flight this much time to reach its boundary before stopping mid-step.
TIMER_GRACE_S = 1.0
#: At the end of the script, how long to wait for a capture being written.
SHUTDOWN_WAIT_S = 60.0


@dataclass(frozen=True)
class ProfileSpec:
    steps: int | None  # None: a time-bounded capture
    ms: float | None
    logdir: str | None
    max_s: float

    @property
    def deadline_s(self) -> float:
        return self.ms / 1000.0 if self.ms is not None else self.max_s


def _number(args: dict[str, Any], name: str, kind: type, low: float, high: float) -> Any:
    value = args.get(name)
    if value is None or value == "":
        return None
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise CommandRefused(f"profile {name}={value!r}: not a number") from None
    if isinstance(value, bool) or not (low <= number <= high):
        raise CommandRefused(f"profile {name}={value!r}: must be between {low:g} and {high:g}")
    return number


def parse_spec(cmd: Command) -> ProfileSpec:
    """The capture asked for; raises CommandRefused with a one-line reason for bad arguments."""
    args = dict(cmd.args)
    unknown = set(args) - {"steps", "ms", "logdir", "max_s"}
    if unknown:
        raise CommandRefused(f"profile: unknown argument(s) {', '.join(sorted(unknown))} (known: steps, ms, logdir)")
    steps = _number(args, "steps", int, 1, MAX_STEPS)
    ms = _number(args, "ms", float, 1, MAX_MS)
    if steps is not None and ms is not None:
        raise CommandRefused("profile: give steps or ms, not both")
    max_s = _number(args, "max_s", float, 1, MAX_MS / 1000) or DEFAULT_MAX_S
    logdir = args.get("logdir")
    if logdir is not None and not isinstance(logdir, str):
        raise CommandRefused(f"profile logdir={logdir!r}: must be a path or gs://bucket/path")
    if steps is None and ms is None:
        steps = DEFAULT_STEPS
    return ProfileSpec(steps=steps, ms=ms, logdir=logdir or None, max_s=max_s)


def profile_runs(logdir: Path) -> set[str]:
    """Names of the capture directories under ``logdir/plugins/profile``."""
    base = logdir / "plugins" / "profile"
    try:
        return {p.name for p in base.iterdir() if p.is_dir()}
    except OSError:
        return set()


class _StepMarker:
    """One XProf step marker around one step call (cheap: one TraceMe)."""

    __slots__ = ("capture", "step_num", "trace")

    def __init__(self, capture: "Capture", step_num: int) -> None:
        self.capture = capture
        self.step_num = step_num
        self.trace: Any = None

    def __enter__(self) -> None:
        self.trace = self.capture.trace_cls("train", step_num=self.step_num, _r=1)
        self.trace.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.trace.__exit__(*exc)
        self.capture.step_done(self.step_num)


class Capture:
    """One capture in progress. Its ``ctx`` is installed as ``StepProbe.step_context``."""

    def __init__(self, profiler: "Profiler", cmd: Command, spec: ProfileSpec, dest: destinations.Destination,
                 before: set[str], start_step: int) -> None:
        import tensorflow as tf

        self.profiler = profiler
        self.cmd = cmd
        self.spec = spec
        self.dest = dest
        self.before = before
        self.start_step = start_step
        self.trace_cls = tf.profiler.experimental.Trace
        self.perf = profiler.perf
        self.t0 = self.perf()
        self.deadline = self.t0 + spec.deadline_s
        self.steps = 0
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.reason = ""
        self.stopping = False
        self._lock = threading.Lock()
        self.ctx: Callable[[int], ContextManager[Any]] = self.step_context
        self.timer = threading.Timer(spec.deadline_s + TIMER_GRACE_S, self.request_stop, args=("timer",))
        self.timer.daemon = True
        self.thread: threading.Thread | None = None

    # --- on the training thread, around each step call ---------------------------------------

    def step_context(self, step_num: int) -> ContextManager[Any]:
        if self.stopping:
            return contextlib.nullcontext()
        if self.perf() >= self.deadline:
            self.request_stop("time")
            return contextlib.nullcontext()
        return _StepMarker(self, step_num)

    def step_done(self, step_num: int) -> None:
        self.steps += 1
        if self.first_step is None:
            self.first_step = step_num
        self.last_step = step_num
        if self.spec.steps is not None and self.steps >= self.spec.steps:
            self.request_stop("steps")

    # --- stopping (any thread) --------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        with self._lock:
            if self.stopping:
                return
            self.stopping = True
            self.reason = reason
        probe = self.profiler.agent.step_probe
        if probe is not None and probe.step_context is self.ctx:
            probe.step_context = None
        self.timer.cancel()
        self.thread = threading.Thread(target=self.profiler.complete, args=(self,), name="tpuwatch-profile",
                                       daemon=True)
        self.thread.start()

    def describe(self) -> str:
        want = f"{self.spec.steps} steps" if self.spec.steps is not None else f"{self.spec.ms:g} ms"
        return f"started at step {self.start_step}, {self.steps} step(s) captured of {want}"


def _tf_session() -> Any:
    """TF's running profiler session (``profiler_v2._profiler``, TF 2.16-2.21; None if none or
    unknown)."""
    try:
        from tensorflow.python.profiler import profiler_v2
    except ImportError:
        return None
    return getattr(profiler_v2, "_profiler", None)


def _forget_failed_session(before: Any) -> None:
    """TF 2.16-2.21's ``profiler_v2.start`` keeps the session it made when the C++ start fails
    with AlreadyExistsError (a profiler server's capture under way): every later start, ours and
    the script's own, then fails with "Another profiler is running". A session our failed start
    left behind is forgotten, as TF does after any other error. Only when there was none before
    our start (``before``): a session that was running then is the script's and stays (a start
    of the script's between that read and ours is the one race left, microseconds wide)."""
    if before is not None:
        return
    try:
        from tensorflow.python.profiler import profiler_v2
    except ImportError:
        return
    lock = getattr(profiler_v2, "_profiler_lock", None)
    if lock is None or getattr(profiler_v2, "_profiler", None) is None:
        return
    with lock:
        profiler_v2._profiler = None


class Profiler:
    """The ``profile`` command's validator and handler (one capture at a time)."""

    def __init__(self, agent: "Agent", perf: Callable[[], float] = clocks.perf) -> None:
        self.agent = agent
        self.perf = perf
        self.active: Capture | None = None

    # --- on receipt (server thread) -------------------------------------------------------------

    def validate(self, cmd: Command) -> None:
        spec = parse_spec(cmd)
        active = self.active
        if active is not None:
            raise CommandRefused(f"a profile capture is already running ({active.describe()}); "
                                 "wait for its result, then ask again")
        dest = self._destination(spec)
        destinations.check_allowed(dest, self.agent.run_dir, ())
        if spec.steps is not None and self.agent.step_probe is None:
            raise CommandRefused("profile --steps needs step detection, which is off in this run; use --ms instead")

    def _destination(self, spec: ProfileSpec) -> destinations.Destination:
        run_dir = self.agent.run_dir
        return destinations.resolve(spec.logdir, run_dir / "profiles", run_dir, run_dir / "profiles" / "gcs")

    # --- at the step boundary (training thread) ---------------------------------------------------

    def handle(self, cmd: Command) -> tuple[str | None, dict[str, Any]]:
        spec = parse_spec(cmd)
        if self.active is not None:  # validated on receipt, but two may have been queued
            raise CommandRefused(f"a profile capture is already running ({self.active.describe()}); wait for its result")
        dest = self._destination(spec)
        try:
            destinations.ensure_writable(dest.local)
        except OSError as e:
            raise CommandRefused(f"profile: {e}") from None
        before = profile_runs(dest.local)
        import tensorflow as tf

        options = None
        if cmd.id.startswith(AUTO_PROFILE_ID_PREFIX):
            # an automatic capture reads tf.data's events, all on the host: no device tracer
            # (CUPTI / the TPU tracer starting on the training thread, device planes that can
            # make a 1 s capture larger than the reader takes), no Python tracer
            options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=2, python_tracer_level=0,
                                                               device_tracer_level=0)
        before_start = _tf_session()
        try:
            tf.profiler.experimental.start(str(dest.local), options=options)
        except Exception as e:
            _forget_failed_session(before_start)
            text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CommandRefused(f"cannot start the profiler ({text}); is the script (or a TensorBoard callback "
                                 "with profile_batch) profiling already? Wait for it to finish") from None
        capture = Capture(self, cmd, spec, dest, before, start_step=self.agent.global_step + 1)
        self.active = capture
        probe = self.agent.step_probe
        if probe is not None:
            probe.step_context = capture.ctx
        capture.timer.start()
        return None, {}  # the Result comes from complete(), on the helper thread

    # --- after the capture (helper thread) ---------------------------------------------------------

    def complete(self, capture: Capture) -> None:
        agent = self.agent
        cmd = capture.cmd
        try:
            ok, message, details = self._stop_and_store(capture)
        except Exception as e:  # a bug here must still give the one Result
            ok, message, details = False, f"profile failed: {type(e).__name__}: {e}", {}
        self.active = None
        agent.finish(cmd, ok, message, details)

    def _stop_and_store(self, capture: Capture) -> tuple[bool, str, dict[str, Any]]:
        import tensorflow as tf

        # TF names the capture directory after the local time in whole seconds at stop: a second
        # capture within the same second would overwrite the first one's <host>.xplane.pb.
        existing = profile_runs(capture.dest.local)
        for _ in range(30):
            if time.strftime("%Y_%m_%d_%H_%M_%S") not in existing:
                break
            time.sleep(0.05)
        try:
            tf.profiler.experimental.stop()
        except Exception as e:
            return False, f"profile failed: the profiler could not stop ({str(e).strip()[:200]})", {}
        seconds = self.perf() - capture.t0
        new = sorted(profile_runs(capture.dest.local) - capture.before)
        if not new:
            return False, f"profile failed: the profiler wrote nothing under {capture.dest.local}", {}
        run_dir = capture.dest.local / "plugins" / "profile" / new[-1]
        files = sorted(p for p in run_dir.iterdir() if p.is_file())
        size = sum(p.stat().st_size for p in files)
        path = str(run_dir)
        details: dict[str, Any] = {
            "path": path, "local_path": path, "bytes": size, "steps": capture.steps,
            "step": capture.first_step if capture.first_step is not None else capture.start_step,
            "logdir": capture.dest.url, "stopped_by": capture.reason,
        }
        if capture.last_step is not None:
            details["last_step"] = capture.last_step
        if capture.dest.gcs is not None:
            from tpuwatch.agent import gcs

            rel = f"plugins/profile/{new[-1]}"
            try:
                gcs.upload_files(((p, f"{rel}/{p.name}") for p in files), capture.dest.gcs)
            except gcs.GcsError as e:
                details["seconds"] = round(self.perf() - capture.t0, 3)
                return False, f"profile captured locally at {path} but not uploaded: {e}", details
            details["path"] = path = capture.dest.gcs.url(rel)
        details["seconds"] = round(self.perf() - capture.t0, 3)
        details["capture_s"] = round(seconds, 3)
        span = ""
        if capture.first_step is not None:
            span = (f" (steps {capture.first_step}-{capture.last_step})" if capture.steps > 1
                    else f" (step {capture.first_step})")
        note = ""
        if capture.reason == "timer" and capture.spec.steps is not None:
            note = f"; only {capture.steps} of {capture.spec.steps} steps ran in {capture.spec.max_s:g} s (stalled?)"
        return True, f"captured {capture.steps} step(s){span} to {path}{note}", details

    # --- the script ended -----------------------------------------------------------------------

    def shutdown(self, timeout_s: float = SHUTDOWN_WAIT_S) -> None:
        """Stops a capture still running and waits (bounded) for its Result to be sent."""
        capture = self.active
        if capture is None:
            return
        capture.request_stop("the script ended")
        if capture.thread is not None:
            capture.thread.join(timeout_s)

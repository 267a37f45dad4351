"""The ``checkpoint`` command: save the training state at the next step boundary, unasked-for code unchanged.

What to save is found without changes to the script. Weak registries (patched constructors; an
object the script drops is never kept alive) remember, in creation order:

- ``tf.train.Checkpoint`` and ``tf.train.CheckpointManager`` objects the script made;
- Keras models (``Trainer.__init__``, ``Functional.__init__``) and optimizers (``BaseOptimizer.__init__``);
- the model whose ``fit`` is running (``TensorFlowTrainer.fit``).

Choice, in order:

1. the ``Checkpoint`` of the script's own ``CheckpointManager`` (same format), saved with a
   manager of ours (it keeps every save) into the ``tpuwatch/`` subdirectory of the script's
   manager's directory, or another ``--dir``. Never through the script's manager: its
   ``max_to_keep`` would rotate the script's own checkpoints out, a request at a time;
2. the script's own ``tf.train.Checkpoint`` without a manager: saved with a manager of ours in
   the destination (default ``<run_dir>/checkpoints``);
3. the model ``fit`` is training, with its optimizer;
4. the top-level Keras models and outermost optimizers the script created;

For 3 and 4 the checkpoint is ``tf.train.Checkpoint(model=…, optimizer=…, tpuwatch_step=…)``
(``model_1``/``model_2``… when there are several) where ``tpuwatch_step`` is an int64 variable
holding the global step the save was taken at; the script's own checkpoints (1, 2) are saved as
they are (the step is the checkpoint number, ``ckpt-<step>``) so that their format stays theirs.

The save runs on the training thread between two steps (from another thread, 17 of 47
checkpoints mixed two steps). A ``gs://`` destination is saved into the run directory first, then
uploaded from a helper thread (training never waits on the network), and the local copy deleted;
the Result is sent when the upload has finished.
"""

from __future__ import annotations

import os
import shutil
import threading
import weakref
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

from tpuwatch.agent import clocks, destinations, post_import
from tpuwatch.agent.agent_api import CommandRefused
from tpuwatch.protocol import Command

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.patches import Patches

PROBE = "checkpoint"
#: At the end of the script, how long to wait for uploads in flight.
SHUTDOWN_WAIT_S = 300.0
#: Where a requested checkpoint goes when its destination is a directory the script's own
#: CheckpointManager keeps: this subdirectory of it, with a manager of ours (keeps every save).
OWN_SUBDIR = "tpuwatch"
_MAX_TRACKED = 4096


class WeakRegistry:
    """Objects in creation order, held weakly; dead entries pruned as they are found."""

    def __init__(self) -> None:
        self._refs: list[weakref.ref[Any]] = []
        self._ids: set[int] = set()

    def add(self, obj: Any) -> None:
        if id(obj) in self._ids and any(r() is obj for r in self._refs):
            return
        try:
            ref = weakref.ref(obj)
        except TypeError:
            return
        self._refs.append(ref)
        self._ids.add(id(obj))
        if len(self._refs) > _MAX_TRACKED:
            self.live()

    def live(self) -> list[Any]:
        out = [o for o in (r() for r in self._refs) if o is not None]
        self._refs = [weakref.ref(o) for o in out]
        self._ids = {id(o) for o in out}
        return out


class Tracker:
    """What the script created that a checkpoint can hold."""

    def __init__(self) -> None:
        self.checkpoints = WeakRegistry()
        self.managers = WeakRegistry()
        self.models = WeakRegistry()
        self.optimizers = WeakRegistry()
        self.fitting: list[weakref.ref[Any]] = []  # models whose fit is running (nested fit: a stack)
        self.own: weakref.WeakSet[Any] = weakref.WeakSet()  # our own Checkpoint/Manager objects
        self._creating_own = threading.local()

    def creating_own(self) -> bool:
        return getattr(self._creating_own, "on", False)

    def make_own(self, factory: Callable[[], Any]) -> Any:
        self._creating_own.on = True
        try:
            obj = factory()
        finally:
            self._creating_own.on = False
        self.own.add(obj)
        return obj

    def script_managers(self) -> list[Any]:
        return [m for m in self.managers.live() if m not in self.own]

    def script_checkpoints(self) -> list[Any]:
        return [c for c in self.checkpoints.live() if c not in self.own]

    def fit_model(self) -> Any:
        while self.fitting:
            model = self.fitting[-1]()
            if model is not None:
                return model
            self.fitting.pop()
        return None


def _register_after_init(tracker: Tracker, registry_of: Callable[[Any], WeakRegistry | None],
                         agent: "Agent") -> Callable[[Callable[..., None]], Callable[..., None]]:
    def make(original: Callable[..., None]) -> Callable[..., None]:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            try:
                if not tracker.creating_own():
                    registry = registry_of(self)
                    if registry is not None:
                        registry.add(self)
            except Exception as e:  # after the script's own __init__ succeeded: never fail its object
                agent.probe_failed(PROBE, e)

        return __init__

    return make


class Checkpointer:
    """The ``checkpoint`` command's validator and handler."""

    def __init__(self, agent: "Agent", perf: Callable[[], float] = clocks.perf) -> None:
        self.agent = agent
        self.perf = perf
        self.tracker = Tracker()
        self._step_var: Any = None
        self._own: tuple[tuple[Any, ...], Any, Any] | None = None  # (key, checkpoint, manager) last used
        self._uploads: set[threading.Thread] = set()

    # --- tracking -------------------------------------------------------------------------------

    def install(self, patches: "Patches") -> None:
        agent = self.agent
        tracker = self.tracker

        def on_error(e: BaseException) -> None:
            agent.probe_failed(PROBE, e)

        def tf_checkpoints(module: ModuleType) -> None:
            from tensorflow.python.checkpoint import checkpoint, checkpoint_management

            patches.wrap(checkpoint.Checkpoint, "__init__",
                         _register_after_init(tracker, lambda o: tracker.checkpoints, agent))
            patches.wrap(checkpoint_management.CheckpointManager, "__init__",
                         _register_after_init(tracker, lambda o: tracker.managers, agent))

        def keras_models(module: ModuleType) -> None:
            patches.wrap(module.Trainer, "__init__", _register_after_init(tracker, lambda o: tracker.models, agent))

        def keras_functional(module: ModuleType) -> None:
            patches.wrap(module.Functional, "__init__", _register_after_init(tracker, lambda o: tracker.models, agent))

        def keras_optimizers(module: ModuleType) -> None:
            patches.wrap(module.BaseOptimizer, "__init__",
                         _register_after_init(tracker, lambda o: tracker.optimizers, agent))

        def keras_fit(module: ModuleType) -> None:
            def make_fit(original: Callable[..., Any]) -> Callable[..., Any]:
                def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
                    tracker.fitting.append(weakref.ref(model))
                    try:
                        return original(model, *args, **kwargs)
                    finally:
                        tracker.fitting.pop()

                return fit

            patches.wrap(module.TensorFlowTrainer, "fit", make_fit)

        post_import.when_imported("tensorflow.python.checkpoint.checkpoint_management", tf_checkpoints, on_error)
        post_import.when_imported("keras.src.trainers.trainer", keras_models, on_error)
        post_import.when_imported("keras.src.models.functional", keras_functional, on_error)
        post_import.when_imported("keras.src.optimizers.base_optimizer", keras_optimizers, on_error)
        post_import.when_imported("keras.src.backend.tensorflow.trainer", keras_fit, on_error)

    def script_dirs(self) -> list[str]:
        """The script's own checkpoint directories (allowed destinations)."""
        out = []
        for manager in self.tracker.script_managers():
            directory = getattr(manager, "directory", None)
            if directory:
                out.append(os.fspath(directory))
        return out

    # --- on receipt (server thread) -------------------------------------------------------------

    def _destination(self, cmd: Command) -> destinations.Destination:
        args = dict(cmd.args)
        unknown = set(args) - {"dir"}
        if unknown:
            raise CommandRefused(f"checkpoint: unknown argument(s) {', '.join(sorted(unknown))} (known: dir)")
        value = args.get("dir")
        if value is not None and not isinstance(value, str):
            raise CommandRefused(f"checkpoint dir={value!r}: must be a path or gs://bucket/path")
        run_dir = self.agent.run_dir
        managers = self.tracker.script_managers()
        if not value and managers and not _is_gcs(managers[-1].directory):
            dest = destinations.Destination(os.fspath(managers[-1].directory), Path(managers[-1].directory))
        else:
            dest = destinations.resolve(value or None, run_dir / "checkpoints", run_dir,
                                        run_dir / "checkpoints" / "gcs")
        if dest.gcs is None and any(_same_dir(m.directory, dest.local) for m in managers):
            # Never into a directory a script's manager keeps: saved through that manager, a
            # request would rotate the script's own checkpoints out (max_to_keep); saved beside
            # it by a manager of ours, it would rewrite the script's `checkpoint` index.
            dest = destinations.Destination(os.path.join(dest.url, OWN_SUBDIR), dest.local / OWN_SUBDIR)
        return dest

    def validate(self, cmd: Command) -> None:
        dest = self._destination(cmd)
        destinations.check_allowed(dest, self.agent.run_dir, self.script_dirs())
        if dest.gcs is not None:
            from tpuwatch.agent import gcs

            try:
                gcs.check_bucket(dest.gcs)
            except gcs.GcsError as e:
                raise CommandRefused(str(e)) from None

    # --- at the step boundary (training thread) ---------------------------------------------------

    def handle(self, cmd: Command) -> tuple[str | None, dict[str, Any]]:
        t0 = self.perf()
        dest = self._destination(cmd)
        try:
            destinations.ensure_writable(dest.local)
        except OSError as e:
            raise CommandRefused(f"checkpoint: {e}") from None
        step = self.agent.global_step
        manager, what = self._manager_for(dest)
        if self._step_var is not None:
            self._step_var.assign(step)
        # What this save may leave half-written (TF writes <prefix>-<step>_temp/ then renames).
        partial = f"{getattr(manager, '_checkpoint_prefix', os.path.join(dest.local, 'ckpt'))}-{step}"
        before = _save_files(partial)
        try:
            prefix = manager.save(checkpoint_number=step)
        except Exception as e:  # TF's save raises OpError, OSError, ValueError...: each refuses the command
            _remove_new(partial, before)
            text = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
            raise CommandRefused(f"checkpoint could not be written to {dest.url}: {text}") from None
        except BaseException:  # Ctrl-C mid-save: no half checkpoint left behind (the Result: the runtime's)
            _remove_new(partial, before)
            raise
        save_s = self.perf() - t0
        files = sorted(Path(p) for p in _glob_prefix(prefix))
        size = sum(p.stat().st_size for p in files)
        details: dict[str, Any] = {"path": prefix, "bytes": size, "step": step, "save_s": round(save_s, 4), "saved": what}
        if dest.gcs is None:
            details["seconds"] = round(self.perf() - t0, 4)
            return f"saved step {step} ({what}) to {prefix}", details
        # gs://: upload off the training thread; the Result comes when it is done.
        thread = threading.Thread(target=self._upload, args=(cmd, dest, Path(prefix), files, details, t0),
                                  name="tpuwatch-checkpoint-upload", daemon=True)
        self._uploads.add(thread)
        thread.start()
        return None, {}

    def _manager_for(self, dest: destinations.Destination) -> tuple[Any, str]:
        """The CheckpointManager to save with, and a few words on what it holds."""
        import tensorflow as tf

        tracker = self.tracker
        managers = tracker.script_managers()
        if managers:
            manager = managers[-1]
            return self._own_manager(("script", id(manager.checkpoint)), lambda: manager.checkpoint, dest,
                                     ours=False), "the script's tf.train.Checkpoint"
        checkpoints = tracker.script_checkpoints()
        if checkpoints:
            ckpt = checkpoints[-1]
            return self._own_manager(("script", id(ckpt)), lambda: ckpt, dest, ours=False), \
                "the script's tf.train.Checkpoint"
        objects = self._keras_objects()
        if not objects:
            raise CommandRefused("nothing to save yet: the script has created no Keras model or optimizer and no "
                                 "tf.train.Checkpoint")
        if self._step_var is None:
            from tensorflow.python.ops import resource_variable_ops

            # A plain resource variable on the host, made outside any strategy scope so that it is
            # not mirrored; it is only a label of the step the save was taken at.
            with tf.init_scope(), tf.device("/cpu:0"):
                self._step_var = resource_variable_ops.ResourceVariable(
                    self.agent.global_step, dtype=tf.int64, name="tpuwatch_step", trainable=False)
        key = ("keras", *sorted((name, id(obj)) for name, obj in objects.items()))
        step_var = self._step_var
        manager = self._own_manager(key, lambda: tf.train.Checkpoint(**objects, tpuwatch_step=step_var), dest,
                                    ours=True)
        return manager, ", ".join(sorted(objects))

    def _own_manager(self, key: tuple[Any, ...], make_checkpoint: Callable[[], Any], dest: destinations.Destination,
                     ours: bool) -> Any:
        """A CheckpointManager of ours over the checkpoint ``make_checkpoint`` gives (``ours``: we build it)."""
        import tensorflow as tf

        full = (*key, os.path.realpath(dest.local))
        if self._own is not None and self._own[0] == full:
            return self._own[2]
        tracker = self.tracker
        ckpt = tracker.make_own(make_checkpoint) if ours else make_checkpoint()
        # Every save was asked for by a person: keep them all.
        manager = tracker.make_own(lambda: tf.train.CheckpointManager(ckpt, str(dest.local), max_to_keep=None))
        self._own = (full, ckpt, manager)
        return manager

    def _keras_objects(self) -> dict[str, Any]:
        fit_model = self.tracker.fit_model()
        if fit_model is not None:
            held: dict[str, Any] = {"model": fit_model}
            if getattr(fit_model, "optimizer", None) is not None:
                held["optimizer"] = fit_model.optimizer
            return held
        models = _top_level(self.tracker.models.live())
        optimizers = self.tracker.optimizers.live()
        wrapped = {id(getattr(o, "inner_optimizer", None)) for o in optimizers}
        optimizers = [o for o in optimizers if id(o) not in wrapped]
        objects: dict[str, Any] = {}
        for label, found in (("model", models), ("optimizer", optimizers)):
            if len(found) == 1:
                objects[label] = found[0]
            else:
                objects.update({f"{label}_{i + 1}": o for i, o in enumerate(found)})
        return objects

    # --- gs:// (helper thread) -------------------------------------------------------------------

    def _upload(self, cmd: Command, dest: destinations.Destination, prefix: Path, files: list[Path],
                details: dict[str, Any], t0: float) -> None:
        from tpuwatch.agent import gcs

        assert dest.gcs is not None
        state = prefix.parent / "checkpoint"  # the manager's index: uploaded last, so it never names a missing file
        pairs = [(p, p.name) for p in files] + ([(state, state.name)] if state.exists() else [])
        try:
            gcs.upload_files(pairs, dest.gcs)
        except gcs.GcsError as e:
            details["seconds"] = round(self.perf() - t0, 4)
            details["local_path"] = str(prefix)
            self.agent.finish(cmd, False, f"checkpoint of step {details['step']} kept locally at {prefix}, "
                                          f"not uploaded: {e}", details)
            self._uploads.discard(threading.current_thread())
            return
        except Exception as e:  # any other failure of the upload thread still ends the command with its Result
            details["seconds"] = round(self.perf() - t0, 4)
            self.agent.finish(cmd, False, f"checkpoint upload failed: {type(e).__name__}: {e}; kept locally at "
                                          f"{prefix}", details)
            self._uploads.discard(threading.current_thread())
            return
        for p in files:  # the bucket has it now; do not fill the training host's disk
            try:
                p.unlink()
            except OSError as e:
                self.agent.event("warning", "checkpoint", f"could not delete the local copy {p}: {e.strerror}")
        url = dest.gcs.url(prefix.name)
        details.update(path=url, seconds=round(self.perf() - t0, 4))
        self.agent.finish(cmd, True, f"saved step {details['step']} ({details['saved']}) to {url}", details)
        self._uploads.discard(threading.current_thread())

    def shutdown(self, timeout_s: float = SHUTDOWN_WAIT_S) -> None:
        """Waits (bounded) for uploads in flight, so their Results are recorded before exit."""
        deadline = clocks.monotonic() + timeout_s
        for thread in list(self._uploads):
            thread.join(max(0.0, deadline - clocks.monotonic()))


def _remove_new(partial: str, before: set[str]) -> None:
    """Removes what an unfinished save of ``partial`` (``<prefix>-<step>``) created: files and
    its ``_temp`` directory that were not there before it began. Best effort: a leftover is
    harmless to the script (nothing names it)."""
    for path in _save_files(partial) - before:
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            pass


def _save_files(partial: str) -> set[str]:
    import glob

    return {*glob.glob(glob.escape(partial) + ".*"), *glob.glob(glob.escape(partial) + "_temp*")}


def _same_dir(directory: Any, local: Path) -> bool:
    if _is_gcs(directory):
        return False
    return bool(os.path.realpath(os.fspath(directory)) == os.path.realpath(local))


def _is_gcs(path: Any) -> bool:
    return bool(os.fspath(path).startswith("gs://"))


def _glob_prefix(prefix: str) -> list[str]:
    import glob

    return glob.glob(glob.escape(prefix) + ".*")


def _variable_ids(model: Any) -> frozenset[int]:
    try:
        return frozenset(id(v) for v in model.variables)
    except Exception:  # a model that cannot list its variables (not built, a Keras bug) holds none we know of
        return frozenset()


def _top_level(models: list[Any]) -> list[Any]:
    """The models no other model contains, in creation order.

    Containment is by variables: a sub-model used as a layer, and the Functional that Keras builds
    inside a Sequential, hold a subset of (or the same) variables as the model around them. Of
    two models with the same variables the first created (the one the script made) is kept.
    """
    sets = [(m, _variable_ids(m)) for m in models]
    sets = [(m, s) for m, s in sets if s]
    out = []
    for i, (m, s) in enumerate(sets):
        inside = any(s < o or (s == o and j < i) for j, (_, o) in enumerate(sets) if j != i)
        if not inside:
            out.append(m)
    return out

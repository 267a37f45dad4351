"""Run a callback right after a module is first imported (or now, if it already is).

Probes that patch Keras must not import Keras themselves: a script that never uses it would pay
3-5 s and hundreds of MB, and importing it early can change what the script sees. So they ask to
be called when the script imports the module. A finder on ``sys.meta_path`` asks the other
finders for the module's spec and wraps that spec's loader's ``exec_module`` (the loader object
is per module, so nothing else is affected); the callbacks run after the module body has run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Callable, Sequence

Callback = Callable[[ModuleType], None]
ErrorHandler = Callable[[BaseException], None]

_lock = threading.RLock()
_pending: dict[str, list[tuple[Callback, ErrorHandler]]] = {}
_finder: "_PostImportFinder | None" = None


def when_imported(module: str, callback: Callback, on_error: ErrorHandler) -> None:
    """Calls ``callback(module)`` once ``module`` is imported: now if it is already imported.

    ``on_error`` gets any exception the callback raises (the import itself always goes on).
    """
    with _lock:
        loaded = sys.modules.get(module)
        if loaded is None:
            _pending.setdefault(module, []).append((callback, on_error))
            _ensure_finder()
            return
    _run(loaded, [(callback, on_error)])


def cancel_all() -> None:
    """Forgets every pending callback and removes the finder (tests, agent shutdown)."""
    global _finder
    with _lock:
        _pending.clear()
        if _finder is not None:
            try:
                sys.meta_path.remove(_finder)
            except ValueError:
                pass
            _finder = None


def _ensure_finder() -> None:
    global _finder
    if _finder is None:
        _finder = _PostImportFinder()
        sys.meta_path.insert(0, _finder)


def _run(module: ModuleType, callbacks: list[tuple[Callback, ErrorHandler]]) -> None:
    for callback, on_error in callbacks:
        try:
            callback(module)
        except Exception as e:  # a probe's bug must never break the script's import
            on_error(e)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self._resolving = threading.local()

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _pending or getattr(self._resolving, "name", None) == fullname:
            return None
        self._resolving.name = fullname
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._resolving.name = None
        loader = getattr(spec, "loader", None) if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original_exec = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original_exec(module)
            with _lock:
                callbacks = _pending.pop(fullname, [])
            _run(module, callbacks)

        try:
            loader.exec_module = exec_module  # an instance attribute: only this module's loader
        except AttributeError as e:  # a loader with __slots__: cannot hook, say why once
            with _lock:
                callbacks = _pending.pop(fullname, [])
            for _, on_error in callbacks:
                on_error(RuntimeError(f"cannot hook the import of {fullname}: {e}"))
        return spec

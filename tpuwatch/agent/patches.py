"""Reversible class-level patches.

Each probe installs its wrappers through a :class:`Patches` so that every patch can be undone
(``restore``) and so a probe whose target is missing in this TF version fails with a one-line
reason instead of a crash.
"""

from __future__ import annotations

import functools
from typing import Any, Callable


class PatchError(Exception):
    """The attribute a probe wanted to wrap is not where it expects (TF internals changed)."""


class Patches:
    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any, bool]] = []

    def wrap(self, owner: Any, name: str, make_wrapper: Callable[[Any], Callable[..., Any]]) -> Any:
        """Replaces ``owner.name`` by ``make_wrapper(original)``; returns the original.

        Only the attribute defined on ``owner`` itself is wrapped (``owner.__dict__``), so a
        subclass patch does not shadow its parent's twice.
        """
        if owner is None:
            raise PatchError(f"cannot patch {name}: its owner is missing")
        had_own = name in vars(owner) if isinstance(owner, type) else hasattr(owner, name)
        original = vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if original is None:
            original = getattr(owner, name, None)
        if original is None:
            raise PatchError(f"{getattr(owner, '__name__', owner)}.{name} not found")
        if isinstance(original, (staticmethod, classmethod)):
            raise PatchError(f"{owner.__name__}.{name} is a {type(original).__name__}; not supported")
        wrapper = make_wrapper(original)
        functools.update_wrapper(wrapper, original)
        wrapper.__tpuwatch_original__ = original  # type: ignore[attr-defined]
        setattr(owner, name, wrapper)
        self._undo.append((owner, name, original, had_own))
        return original

    def restore(self) -> None:
        while self._undo:
            owner, name, original, had_own = self._undo.pop()
            if had_own:
                setattr(owner, name, original)
            else:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass

    def suspend(self) -> None:
        """Puts the originals back without forgetting the wrappers (``resume`` re-applies them).

        Lets a benchmark alternate instrumented and plain phases in one process. Suspending twice
        is the same as once (a second call would record the originals as the wrappers).
        """
        if getattr(self, "_suspended", None):
            return
        self._suspended = [(owner, name, getattr(owner, name)) for owner, name, _, _ in self._undo]
        for owner, name, original, _ in self._undo:
            setattr(owner, name, original)

    def resume(self) -> None:
        for owner, name, wrapper in getattr(self, "_suspended", ()):
            setattr(owner, name, wrapper)
        self._suspended = []

    def __len__(self) -> int:
        return len(self._undo)

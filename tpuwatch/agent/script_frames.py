"""Which frames of a stack are the script's: the one test for "the script's line" on a stack
taken from another thread (``sys._current_frames``).

A frame is the script's (or of a module of the user's) when its file is under none of the
library roots: Python's standard library and site-packages, TensorFlow, Keras, NumPy and
tpuwatch itself, nor generated code (``<string>``, autograph's conversions).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from typing import Any


def library_roots() -> tuple[str, ...]:
    """Directories whose frames are not the script's (each ends with the path separator)."""
    roots = {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = paths.get(key)
        if path:
            roots.add(os.path.abspath(path))
    for name in ("numpy", "tensorflow", "keras", "tf_keras"):
        mod = sys.modules.get(name)
        path = getattr(mod, "__file__", None)
        if path:
            roots.add(os.path.dirname(os.path.dirname(os.path.abspath(path))))
    return tuple(r.rstrip(os.sep) + os.sep for r in roots)


def is_script(path: str, roots: tuple[str, ...]) -> bool:
    """A frame's file is the script's: not under a library root, not generated code."""
    return not path.startswith(roots) and not path.startswith("<") and "__autograph_generated" not in path


def innermost(frame: Any, roots: tuple[str, ...]) -> tuple[Any, list[Any]]:
    """(the innermost frame of the script's on the stack that ends at ``frame``, or None; the
    library frames inside it, innermost first)."""
    inside: list[Any] = []
    f = frame
    while f is not None:
        if is_script(f.f_code.co_filename, roots):
            return f, inside
        inside.append(f)
        f = f.f_back
    return None, inside

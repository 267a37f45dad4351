"""The agent's frames (and runpy's) left out of what TensorFlow and Keras print, as they leave out
their own, so the script's errors read as under plain python.

Three filters, each guarded (private names; TF 2.16 / Keras 3.3 on):

- TensorFlow's *op creation stacks* (``tf_stack``): recorded while tracing and printed in a graph
  error's "Detected at node ... defined at (most recent call last)". A per-thread set of file names
  to drop; every thread's starts empty (``SentinelFilter``). The agent's sits at the bottom of every
  thread's instead, so runpy's frames above the script and the agent's patched calls are dropped.
- TensorFlow's and Keras' *exception traceback* filters (``traceback_utils._EXCLUDED_PATHS``,
  path prefixes): the agent's directory joins them, so a traceback the script prints itself (it
  caught the error) has no agent frame below TensorFlow's or Keras' entry point either.

The uncaught exception's own traceback is filtered by ``plain_traceback`` in ``__main__``.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.patches import Patches

AGENT_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
RUNPY_FILES = ("<frozen runpy>", runpy.__file__)


def own_frame(filename: str) -> bool:
    """A frame of tpuwatch's, not the script's: the agent's (its runner, its patched step calls)
    and runpy's, which a plain `python script.py` does not have."""
    return filename.startswith(AGENT_DIR) or filename in RUNPY_FILES


def own_files() -> frozenset[str]:
    """The file names (as code objects carry them) of the agent's modules and runpy."""
    names: set[str] = set(RUNPY_FILES)
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and own_frame(os.path.abspath(path)):
            names.update((path, os.path.abspath(path)))
    for entry in os.listdir(AGENT_DIR):
        if entry.endswith(".py"):
            names.add(AGENT_DIR + entry)
    return frozenset(names)


def install(agent: "Agent", patches: "Patches") -> None:
    """Called once TensorFlow is imported (Keras' filter: once Keras' is). Never raises into the
    script: a filter that cannot be set is reported once and left as it was."""
    from tpuwatch.agent import post_import

    try:
        _filter_op_stacks()
    except Exception as e:  # a TF without this layout: its stacks keep the agent's frames
        agent.probe_failed("traceback_filters", e)
    for module in ("tensorflow.python.util.traceback_utils", "keras.src.utils.traceback_utils"):
        post_import.when_imported(module, _exclude_agent_dir, lambda e: agent.probe_failed("traceback_filters", e))


def _exclude_agent_dir(module: Any) -> None:
    excluded = getattr(module, "_EXCLUDED_PATHS", None)
    if isinstance(excluded, tuple) and AGENT_DIR.rstrip(os.sep) not in excluded:
        module._EXCLUDED_PATHS = (*excluded, AGENT_DIR.rstrip(os.sep))


def _filter_op_stacks() -> None:
    from tensorflow.python.util import tf_stack

    files = own_files()

    class AgentFilter(tf_stack.StackTraceFilter):  # type: ignore[misc]  # TF has no type information
        """The bottom of every thread's filter stack: TensorFlow's filters pushed above it add
        their files to these (``CurrentModuleFilter`` unites with its parent's)."""

        def __init__(self) -> None:
            super().__init__()
            self.parent = None
            self.update()

        def get_filtered_filenames(self) -> frozenset[str]:
            return files

    stacks = tf_stack._source_filter_stacks
    sentinel = tf_stack.SentinelFilter
    stacks.default_factory = lambda: [AgentFilter()]
    for stack in list(stacks.values()):  # threads that recorded a stack already (TF's import)
        if len(stack) == 1 and type(stack[0]) is sentinel:
            stack[0] = AgentFilter()

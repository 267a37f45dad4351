"""tpuwatch: watch and diagnose TensorFlow training on TPUs from a terminal.

Imports nothing heavy: no TensorFlow, no Textual. The explicit step API for training loops the
agent's patches cannot understand lives in :mod:`tpuwatch.api` and is re-exported here.
"""

__version__ = "0.1.0"

from tpuwatch.api import StepInfo, step

__all__ = ["__version__", "step", "StepInfo"]

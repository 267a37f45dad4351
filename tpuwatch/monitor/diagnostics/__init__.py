"""Diagnostics: rules over protocol messages that say what is wrong with a run and what to do.

Pure Python over :mod:`tpuwatch.protocol` messages (no TensorFlow, no Textual). See
``docs/diagnostics.md`` for every rule, its thresholds and why.
"""

from .engine import RULE_IDS, Engine
from .thresholds import Thresholds

__all__ = ["Engine", "Thresholds", "RULE_IDS"]

"""Makes tests/tpu/tpu_fakes.py importable under any pytest import mode (as tests/ui does)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

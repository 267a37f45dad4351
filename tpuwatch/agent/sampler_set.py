"""The agent's periodic samplers, run on the agent's thread at the sample rate."""

from __future__ import annotations

from typing import Callable

from tpuwatch.agent.agent_api import Sampler
from tpuwatch.protocol import Message


class SamplerSet:
    """Named samplers; one that raises is disabled through ``probe_failed`` (said once) and
    skipped from then on, as is one whose probe is in ``disabled`` (the agent's, shared)."""

    def __init__(self, disabled: dict[str, str], probe_failed: Callable[[str, BaseException], None]) -> None:
        self._samplers: list[tuple[str, Sampler]] = []
        self._disabled = disabled
        self._probe_failed = probe_failed

    def add(self, name: str, sampler: Sampler) -> None:
        """``sampler`` runs on the agent thread at the sample rate; it fails once, then stops."""
        self._samplers.append((name, sampler))

    def sample(self, append: Callable[[Message], None]) -> None:
        """Runs every sampler still enabled, handing each message it gives to ``append``."""
        for name, sampler in self._samplers:
            if name in self._disabled:
                continue
            try:
                for msg in sampler():
                    append(msg)
            except Exception as e:  # a sampler's bug stops that sampler (said once), not the agent thread
                self._probe_failed(name, e)

"""The agent's periodic samplers, run on the agent's thread at the sample rate (or at their own,
faster one)."""

from __future__ import annotations

from typing import Callable

from tpuwatch.agent.agent_api import Sampler
from tpuwatch.protocol import Message

#: The shortest pace a sampler may ask for (the agent's thread never spins).
MIN_PACE_S = 0.01


class _Paced:
    """A sampler with a pace of its own: seconds between two calls, or a function of the sampler's
    asked after each call; ``due``: when the next call is (agent clock)."""

    __slots__ = ("name", "sampler", "every_s", "due")

    def __init__(self, name: str, sampler: Sampler, every_s: float | Callable[[], float]) -> None:
        self.name, self.sampler, self.every_s, self.due = name, sampler, every_s, 0.0


class SamplerSet:
    """Named samplers; one that raises is disabled through ``probe_failed`` (said once) and
    skipped from then on, as is one whose probe is in ``disabled`` (the agent's, shared)."""

    def __init__(self, disabled: dict[str, str], probe_failed: Callable[[str, BaseException], None]) -> None:
        self._samplers: list[tuple[str, Sampler]] = []
        self._paced: list[_Paced] = []
        self._disabled = disabled
        self._probe_failed = probe_failed

    def add(self, name: str, sampler: Sampler, every_s: float | Callable[[], float] | None = None) -> None:
        """``sampler`` runs on the agent thread at the sample rate, or every ``every_s`` seconds
        when that is given (a function: asked after each call; see :meth:`sample_fast`); it fails
        once, then stops."""
        if every_s is None:
            self._samplers.append((name, sampler))
        else:
            self._paced.append(_Paced(name, sampler, every_s))

    def sample(self, append: Callable[[Message], None]) -> None:
        """Runs every sampler at the sample rate still enabled, handing each message it gives to
        ``append``."""
        for name, sampler in self._samplers:
            self._run(name, sampler, append)

    def sample_fast(self, now: float, append: Callable[[Message], None]) -> float:
        """Runs the samplers with a rate of their own that are due at ``now``; returns when the
        next one is due (infinity when there is none)."""
        due = float("inf")
        for paced in self._paced:
            if paced.name in self._disabled:
                continue  # no more wakes for it
            if now >= paced.due:
                self._run(paced.name, paced.sampler, append)
                every = paced.every_s
                try:
                    pace = float(every() if callable(every) else every)
                except Exception as e:  # its pace's bug stops that sampler, not the agent thread
                    self._probe_failed(paced.name, e)
                    continue
                paced.due = now + max(pace, MIN_PACE_S)
            due = min(due, paced.due)
        return due

    def _run(self, name: str, sampler: Sampler, append: Callable[[Message], None]) -> None:
        if name in self._disabled:
            return
        try:
            for msg in sampler():
                append(msg)
        except Exception as e:  # a sampler's bug stops that sampler (said once), not the agent thread
            self._probe_failed(name, e)

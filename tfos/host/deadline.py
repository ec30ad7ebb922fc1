"""A deadline as one object: a wait that must end holds a :class:`Deadline` instead of adding a
timeout to ``time.monotonic()`` by hand, and asks it what is left, whether it passed, and how long
it may sleep without overshooting it. Its clock is injectable, so a wait built on it is tested one
look at a time without sleeping (tests/unit/test_deadline.py)."""

from __future__ import annotations

import time
from typing import Callable


class Deadline:
    """``seconds`` from its creation on ``clock`` (``time.monotonic`` unless a test passes its own)."""

    __slots__ = ("seconds", "_clock", "_start")

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds = float(seconds)
        self._clock = clock
        self._start = clock()

    def elapsed(self) -> float:
        return self._clock() - self._start

    def remaining(self) -> float:
        """Seconds left, never below 0."""
        return max(0.0, self.seconds - self.elapsed())

    def expired(self) -> bool:
        return self.elapsed() >= self.seconds

    def slice(self, at_most: float) -> float:
        """How long the next sleep of a polling wait may be: ``at_most``, or what is left if less."""
        return min(at_most, self.remaining())

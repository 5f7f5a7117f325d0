"""A step's time limit, shared by every step that polls the API."""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_INTERVAL_S = 1.0


class Deadline:
    """A step's time limit, counting both the clock and the context's sleeps.

    The sleeps count too so a step driven by a fake `sleep` (unit tests) times out after the
    same number of polls it would make for real, instead of spinning forever.
    """

    def __init__(self, limit_s: float, sleep: Callable[[float], None]) -> None:
        self.limit_s = limit_s
        self._sleep = sleep
        self._started = time.monotonic()
        self._slept_s = 0.0

    @property
    def elapsed_s(self) -> float:
        return max(time.monotonic() - self._started, self._slept_s)

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.limit_s - self.elapsed_s)

    @property
    def expired(self) -> bool:
        return self.elapsed_s >= self.limit_s

    def sleep(self, delay_s: float) -> None:
        """Sleep `delay_s`, never past the deadline."""
        delay_s = min(delay_s, self.remaining_s)
        if delay_s > 0:
            self._sleep(delay_s)
            self._slept_s += delay_s

"""Tests only: the run's clock read from a file named by $ROLLOUT_TEST_CLOCK_FILE.

A test that makes maintenance windows a day apart come seconds apart moves its own clock
ahead and speeds it up; a run it starts (a lab Job pod's `rollout apply`) must judge the
window by that clock, not the wall clock. The test writes the clock to a file and names it
in the variable; `run_clock()` reads the file at every call, so the clock may move while
the run goes on. The file holds one line `START,OFFSET_S,SCALE` (seconds since the epoch,
floats): the time is START + OFFSET_S + (real now - START) x SCALE (SCALE 0: stopped).

Without the variable (every real use) the clock is the wall clock: nothing here is read.
Only the run's window checks use this clock; leases, journals and the API keep real time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rollout.errors import BadInput

CLOCK_FILE_ENV = "ROLLOUT_TEST_CLOCK_FILE"


@dataclass(frozen=True)
class ScaledTime:
    """A clock `offset_s` ahead of real time from `start` on, running `scale` times faster."""

    start: float
    offset_s: float
    scale: float

    def at(self, real: float) -> float:
        """This clock's time (seconds since the epoch) when the real time is `real`."""
        return self.start + self.offset_s + (real - self.start) * self.scale

    def to_text(self) -> str:
        return f"{self.start!r},{self.offset_s!r},{self.scale!r}"

    @classmethod
    def from_text(cls, text: str, where: str = CLOCK_FILE_ENV) -> ScaledTime:
        try:
            start, offset_s, scale = (float(part) for part in text.strip().split(","))
        except ValueError as error:
            raise BadInput(f"{where}: not START,OFFSET_S,SCALE: {text.strip()!r}") from error
        return cls(start, offset_s, scale)


def run_clock() -> Callable[[], datetime]:
    """The clock a run's window checks read: the wall clock, unless $ROLLOUT_TEST_CLOCK_FILE
    names a clock file (tests only)."""
    named = os.environ.get(CLOCK_FILE_ENV, "")
    if not named:
        return lambda: datetime.now(UTC)
    path = Path(named)

    def now() -> datetime:
        try:
            scaled = ScaledTime.from_text(path.read_text(), str(path))
        except OSError as error:
            raise BadInput(f"{CLOCK_FILE_ENV}={named}: {error.strerror}") from error
        return datetime.fromtimestamp(scaled.at(time.time()), UTC)

    return now

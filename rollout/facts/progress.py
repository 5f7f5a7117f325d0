"""Progress of gathering a fleet's facts: nodes answered, failed and left, with a rate.

On a terminal one line is redrawn in place (at most every REDRAW_S); elsewhere (CI logs,
a pipe) only the final line is written, so a log holds one line per gathering, not one
per node.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TextIO

REDRAW_S = 0.2


class GatherProgress(Protocol):
    """Told of each node as it answers or fails (from the gathering's threads)."""

    def node_done(self, name: str, ok: bool) -> None: ...


@dataclass(frozen=True)
class GatherTally:
    """How far a gathering is: counts and the seconds since it started."""

    total: int
    answered: int = 0
    failed: int = 0
    elapsed_s: float = 0.0

    @property
    def left(self) -> int:
        return self.total - self.answered - self.failed

    @property
    def rate(self) -> float:
        """Nodes done per second (0 before the first second's tenth)."""
        done = self.answered + self.failed
        return done / self.elapsed_s if self.elapsed_s >= 0.1 else 0.0

    def with_node(self, ok: bool, elapsed_s: float) -> GatherTally:
        return GatherTally(
            total=self.total,
            answered=self.answered + (1 if ok else 0),
            failed=self.failed + (0 if ok else 1),
            elapsed_s=elapsed_s,
        )

    def to_line(self) -> str:
        """`facts: 412/1000 answered, 3 failed, 585 left, 57.3 nodes/s`."""
        return (
            f"facts: {self.answered}/{self.total} answered, {self.failed} failed, "
            f"{self.left} left, {self.rate:.1f} nodes/s"
        )

    def to_final_line(self) -> str:
        """`facts: 997/1000 answered, 3 failed in 17.4s (57.3 nodes/s)`."""
        return (
            f"facts: {self.answered}/{self.total} answered, {self.failed} failed "
            f"in {self.elapsed_s:.1f}s ({self.rate:.1f} nodes/s)"
        )


class StreamProgress:
    """GatherProgress written to a stream: redrawn on a terminal, a final line elsewhere."""

    def __init__(
        self,
        stream: TextIO,
        total: int,
        *,
        terminal: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._terminal = stream.isatty() if terminal is None else terminal
        self._clock = clock
        self._started = clock()
        self._drawn_at: float | None = None
        self._lock = threading.Lock()
        self.tally = GatherTally(total=total)

    def node_done(self, name: str, ok: bool) -> None:
        with self._lock:
            now = self._clock()
            self.tally = self.tally.with_node(ok, now - self._started)
            if not self._terminal:
                return
            if self._drawn_at is not None and now - self._drawn_at < REDRAW_S:
                return
            self._drawn_at = now
            self._stream.write("\r\x1b[K" + self.tally.to_line())
            self._stream.flush()

    def finish(self) -> None:
        """The final line (replacing the redrawn one on a terminal)."""
        with self._lock:
            self.tally = GatherTally(
                self.tally.total,
                self.tally.answered,
                self.tally.failed,
                self._clock() - self._started,
            )
            prefix = "\r\x1b[K" if self._terminal and self._drawn_at is not None else ""
            self._stream.write(prefix + self.tally.to_final_line() + "\n")
            self._stream.flush()

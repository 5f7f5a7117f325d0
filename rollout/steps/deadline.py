"""A step's time limit, shared by every step that polls the API, and the halt watch that ends
a wait early when a halt label appears on a node (DESIGN invariant 5)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rollout.errors import RolloutError

POLL_INTERVAL_S = 1.0

# How often a waiting step lists the nodes carrying a halt label: one cheap list with a label
# selector, often enough that a halt is seen within seconds, rare enough for a large fleet.
HALT_CHECK_INTERVAL_S = 3.0


class HaltLabelSeen(RolloutError):
    """A halt label appeared on a node while a step waited on the cluster: the wait ends at
    once and the run halts, the node in flight left as it is for `rollout resume`."""


# Given the node whose own label its step judges ("" for none), what halts the run ("" none).
HaltProbe = Callable[[str], str]


@dataclass
class HaltWatch:
    """Asks its probe, at most every `interval_s`, whether a node carries a halt label."""

    probe: HaltProbe
    interval_s: float = HALT_CHECK_INTERVAL_S
    _checked_at: float | None = field(default=None, init=False)

    def check(self, except_node: str = "") -> None:
        """Raise HaltLabelSeen when a halt label is on a node (`except_node` aside)."""
        now = time.monotonic()
        if self._checked_at is not None and now - self._checked_at < self.interval_s:
            return
        self._checked_at = now
        found = self.probe(except_node)
        if found:
            raise HaltLabelSeen(found)


class Deadline:
    """A step's time limit, counting both the clock and the context's sleeps.

    The sleeps count too so a step driven by a fake `sleep` (unit tests) times out after the
    same number of polls it would make for real, instead of spinning forever. With a halt
    watch, every sleep first checks for a halt label, so no wait outlives one.
    """

    def __init__(
        self,
        limit_s: float,
        sleep: Callable[[float], None],
        watch: HaltWatch | None = None,
        except_node: str = "",
    ) -> None:
        self.limit_s = limit_s
        self._sleep = sleep
        self._watch = watch
        self._except_node = except_node
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
        """Sleep `delay_s`, never past the deadline; HaltLabelSeen when a halt label is on."""
        if self._watch is not None:
            self._watch.check(self._except_node)
        delay_s = min(delay_s, self.remaining_s)
        if delay_s > 0:
            self._sleep(delay_s)
            self._slept_s += delay_s

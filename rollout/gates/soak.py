"""policy.soak_s: after a wave, wait, then read the health gates of every node done so far.

A node can come back whole and degrade minutes later (an Xid under the first real load, a
device the plugin marks unhealthy); the next wave must not start on top of that. The soak
waits in short steps and checks the run between them as before starting a node (the lease,
a pause, halt labels, the maintenance window: the soak counts against the window, and a
window that closes during it ends the run's window cleanly). Then every node that succeeded
so far is read through the same gates as the `gates` step; one that fails is cordoned with
its evidence and the run halts before the next wave.

The soak is journalled (soak-started with its end, soak-finished once the gates passed
again), and its end is wall time: the wave's last node finished, its nodes have run the
change ever since, whether this process was there or not. So a run resumed (after a pause,
a kill, a closed window) skips a finished soak, waits only what is left of a cut one, and
goes straight to the gates when that end passed while the run was stopped. The time is the
clock of the process running rollout, never a node's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from rollout.plan import NodePlan
from rollout.steps.base import StepContext
from rollout.steps.gates import read_gates

# How often the soak checks the run (the lease, a pause, halt labels, the window).
SOAK_POLL_S = 5.0


@dataclass(frozen=True)
class Degraded:
    """A node that failed a gate during the soak, with its context and the evidence."""

    node: NodePlan
    ctx: StepContext
    evidence: str


@dataclass(frozen=True)
class Soak:
    """The wait between waves and the re-read of the gates after it."""

    seconds: int
    clock: Callable[[], datetime]
    sleep: Callable[[float], None]
    # raises the executor's Halt when the run must stop (lease, pause, halt label, window)
    check_run: Callable[[], None]
    say: Callable[[str], None]

    def ends_from_now(self) -> datetime:
        """When a soak starting now ends."""
        return self.clock() + timedelta(seconds=self.seconds)

    def left_s(self, ends: datetime) -> int:
        """Whole seconds left until `ends` (0 once it passed)."""
        return max(0, math.ceil((ends - self.clock()).total_seconds()))

    def wait(self, wave: int, nodes: int, ends: datetime) -> None:
        """Wait until `ends` (the journalled end of the wave's soak), checking the run."""
        left = self.left_s(ends)
        gates = f"reading the health gates of {nodes} node(s) again before the next wave"
        if left >= self.seconds:
            self.say(f"wave {wave} done: soaking {self.seconds}s, then {gates}")
        elif left:
            self.say(
                f"wave {wave}: soaking the remaining {left}s of its {self.seconds}s soak, "
                f"then {gates}"
            )
        else:
            self.say(
                f"wave {wave}: its {self.seconds}s soak ended while the run was stopped: {gates}"
            )
        while (remaining_s := (ends - self.clock()).total_seconds()) > 0:
            self.check_run()
            self.sleep(min(SOAK_POLL_S, remaining_s))
        self.check_run()

    def recheck(
        self, nodes: Sequence[NodePlan], make_context: Callable[[NodePlan], StepContext]
    ) -> list[Degraded]:
        """Every node read through its gates once more; those that fail, with the evidence."""
        degraded = []
        for node in nodes:
            ctx = make_context(node)
            evidence, _ = read_gates(ctx)
            if evidence:
                degraded.append(Degraded(node, ctx, f"during the soak after its wave: {evidence}"))
        return degraded

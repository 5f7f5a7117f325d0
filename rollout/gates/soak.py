"""policy.soak_s: after a wave, wait, then read the health gates of every node done so far.

A node can come back whole and degrade minutes later (an Xid under the first real load, a
device the plugin marks unhealthy); the next wave must not start on top of that. The soak
waits in short steps and checks the run between them as before starting a node (the lease,
a pause, halt labels, the maintenance window: the soak counts against the window, and a
window that closes during it ends the run's window cleanly). Then every node that succeeded
so far is read through the same gates as the `gates` step; one that fails is cordoned with
its evidence and the run halts before the next wave.
"""

from __future__ import annotations

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

    def wait(self, wave: int, nodes: int) -> None:
        self.say(
            f"wave {wave} done: soaking {self.seconds}s, then reading the health gates of "
            f"{nodes} node(s) again before the next wave"
        )
        ends = self.clock() + timedelta(seconds=self.seconds)
        while (left := (ends - self.clock()).total_seconds()) > 0:
            self.check_run()
            self.sleep(min(SOAK_POLL_S, left))
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

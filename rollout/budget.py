"""The unavailability budget: whether one more node may be taken down (invariant 4).

Never more target nodes unavailable than max_unavailable, counting every target the API
shows cordoned or NotReady and every node this run holds down. Three rules decide what a
node about to start costs:

- a node this run already took down (cordoned by it, journalled, not finished; or running
  in this process) holds its slot: continuing it after `rollout resume` makes nothing more
  unavailable, so it never needs a new one, however many others are down meanwhile;
- a node that went NotReady, uncordoned, after this run changed a cluster-wide object (the
  ClusterPolicy: the GPU Operator then restarts operands, and a toolkit restart takes its
  node NotReady for containerd's RestartSec) is waited for, at most SETTLE_WAIT_S from the
  moment it went NotReady, before it counts: only a node still NotReady after that halts;
- everything else unavailable counts at once: a node cordoned by someone else, NotReady
  since before the change, or NotReady with no change of this run to explain it.

One RunBudget per run owns the number: the executor builds it from the plan, asks it before
taking a node down, and hands it to every step (StepContext.budget); a step that hands its
node to another controller's upgrade (driver.release: the GPU Operator cordons and upgrades
it) takes the node's slot through it too.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime

# How long a node NotReady since this run's own cluster-wide change is waited for before it
# counts: a toolkit restart is containerd's RestartSec (5 s) twice; the operator rolls node
# by node, so a slow rollout shows each node NotReady in turn, never one for minutes.
SETTLE_WAIT_S = 120.0


def clock_time(moment: datetime | None) -> str:
    """A moment as the run's progress lines show time: the local clock's HH:MM:SS."""
    return "?" if moment is None else f"{moment.astimezone():%H:%M:%S}"


@dataclass(frozen=True)
class ClusterChange:
    """This run's first change of a cluster-wide object: the step, its node, when it began."""

    step: str
    node: str
    at: datetime

    def describe(self) -> str:
        return (
            f"this run's ClusterPolicy change ({self.step} on {self.node} at {clock_time(self.at)})"
        )


@dataclass(frozen=True)
class NodeAvailability:
    """What the budget reads of one node: cordoned, Ready, and since when it is NotReady."""

    name: str
    cordoned: bool
    ready: bool
    not_ready_since: datetime | None = None


class Verdict(enum.Enum):
    START = "start"  # within the budget, or the node holds its slot already
    WAIT = "wait"  # over it only through nodes settling after this run's own change
    HALT = "halt"  # over it: the reason says which nodes


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str = ""


@dataclass(frozen=True)
class GroupLimit:
    """max_unavailable_per_group of one topology group (rollout.topology): its nodes, limit."""

    label: str
    nodes: frozenset[str]
    limit: int


@dataclass(frozen=True)
class UnavailabilityBudget:
    """max_unavailable over the plan's targets, and this run's cluster-wide change, if any;
    and max_unavailable_per_group over each topology group's nodes, where the plan sets it."""

    limit: int
    targets: frozenset[str]
    change: ClusterChange | None = None
    settle_wait_s: float = SETTLE_WAIT_S
    groups: tuple[GroupLimit, ...] = ()

    def counting(self, names: Collection[str]) -> UnavailabilityBudget:
        """This budget over `names` as well as its targets."""
        return dataclasses.replace(self, targets=self.targets | frozenset(names))

    def unavailable(self, nodes: Sequence[NodeAvailability]) -> set[str]:
        """The targets the API shows cordoned or NotReady."""
        return {n.name for n in nodes if n.name in self.targets and (n.cordoned or not n.ready)}

    def decide(
        self,
        node: str,
        nodes: Sequence[NodeAvailability],
        held: Collection[str],
        now: datetime,
        waited_s: float = 0.0,
    ) -> Decision:
        """Whether `node` may be taken down now. `held`: the nodes this run holds down;
        `waited_s`: how long the caller has waited already (nodes that keep going NotReady
        in turn are waited for no longer than one node would be)."""
        if node in held:
            return Decision(Verdict.START, f"{node} is already down by this run: no new slot")
        down = (self.unavailable(nodes) | set(held)) - {node}
        decision = self._judge(
            node, down, self.limit, f"max_unavailable {self.limit}", nodes, held, now, waited_s
        )
        for group in self.groups:
            if decision.verdict is Verdict.START and node in group.nodes:
                decision = self._judge(
                    node,
                    down & group.nodes,
                    group.limit,
                    f"max_unavailable_per_group {group.limit} of group {group.label}",
                    nodes,
                    held,
                    now,
                    waited_s,
                )
        return decision

    def _judge(
        self,
        node: str,
        down: set[str],
        limit: int,
        over: str,
        nodes: Sequence[NodeAvailability],
        held: Collection[str],
        now: datetime,
        waited_s: float,
    ) -> Decision:
        """`decide` against one limit (said as `over`): `down` are the other unavailable
        nodes it counts."""
        if len(down) + 1 <= limit:
            return Decision(Verdict.START)
        settling = sorted(
            (n for n in nodes if n.name in down and n.name not in held and self._settling(n, now)),
            key=lambda n: n.name,
        )
        if waited_s >= self.settle_wait_s:
            settling = []
        if settling and len(down) - len(settling) + 1 <= limit and self.change is not None:
            waiting = "; ".join(
                f"{n.name}, NotReady since {clock_time(n.not_ready_since)}" for n in settling
            )
            return Decision(
                Verdict.WAIT,
                f"waiting for {waiting}, after {self.change.describe()}, at most "
                f"{round(self.settle_wait_s)}s, before taking {node} down",
            )
        reason = (
            f"taking {node} down would make {len(down) + 1} node(s) unavailable, over "
            f"{over} (already unavailable: {', '.join(sorted(down))})"
        )
        late = sorted(n.name for n in nodes if n.name in down and self._since_change(n))
        if late and self.change is not None:
            reason += (
                f"; {', '.join(late)} still NotReady, waited for at most "
                f"{round(self.settle_wait_s)}s after "
                f"{self.change.describe()}"
            )
        return Decision(Verdict.HALT, reason)

    def _since_change(self, node: NodeAvailability) -> datetime | None:
        """When the node went NotReady, if it did so uncordoned after this run's cluster-wide
        change began (a condition's time has whole seconds, so the change's second counts)."""
        since = node.not_ready_since
        if self.change is None or node.cordoned or node.ready or since is None:
            return None
        return since if since >= self.change.at.replace(microsecond=0) else None

    def _settling(self, node: NodeAvailability, now: datetime) -> bool:
        since = self._since_change(node)
        return since is not None and (now - since).total_seconds() < self.settle_wait_s


def no_change() -> ClusterChange | None:
    """A run that has changed no cluster-wide object."""
    return None


@dataclass(eq=False)
class RunBudget:
    """The run's one unavailability budget: max_unavailable (and per group) over the plan's
    targets, with this run's first cluster-wide change as the journal tells it at each
    decision; and the nodes this run has handed to another controller's upgrade, each of
    which holds its slot, for the executor and for every such step, until it is settled."""

    limit: int
    targets: frozenset[str]
    groups: tuple[GroupLimit, ...] = ()
    first_change: Callable[[], ClusterChange | None] = no_change
    # the nodes of a wave run in threads: deciding and handing over are one act
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _released: set[str] = field(default_factory=set, init=False)

    def current(self) -> UnavailabilityBudget:
        """The budget as it stands: with this run's cluster-wide change, once it made one."""
        return UnavailabilityBudget(
            self.limit, self.targets, self.first_change(), groups=self.groups
        )

    @property
    def released(self) -> frozenset[str]:
        """The nodes handed over and not settled yet: each holds its slot."""
        with self._lock:
            return frozenset(self._released)

    def release(
        self,
        node: str,
        nodes: Sequence[NodeAvailability],
        now: datetime,
        hand_over: Callable[[], object],
    ) -> Decision:
        """Hand `node` over (`hand_over`) if one more unavailable node fits: decided and done
        under one lock, so two nodes' threads never both take the last slot. `nodes`: every
        node the other controller serves, each of which counts as the targets do (its
        upgrades reach them whatever rollout targets). The node then holds its slot until
        `settled`."""
        with self._lock:
            budget = self.current().counting([n.name for n in nodes])
            decision = budget.decide(node, nodes, self._released, now)
            if decision.verdict is Verdict.START:
                hand_over()
                self._released.add(node)
            return decision

    def taken(self, node: str, nodes: Sequence[NodeAvailability]) -> list[str]:
        """What holds the slots `release` would give `node`: the unavailable nodes among
        `nodes` and the targets, and the nodes handed over."""
        unavailable = self.current().counting([n.name for n in nodes]).unavailable(nodes)
        return sorted((unavailable | self.released) - {node})

    def hold(self, node: str) -> None:
        """Count a node handed over before this process (a resumed run) as released."""
        with self._lock:
            self._released.add(node)

    def settled(self, node: str) -> None:
        """The node's handed-over upgrade ended: its slot is the executor's to count again."""
        with self._lock:
            self._released.discard(node)

"""What a change kind is to the planner, and the one planning context every `plan` is given.

A change kind (registry, containerd, time-slicing, driver, MIG) answers the planner through
`ChangeKindPlanner`: the playbook its change runs, the step modules it brings, the cluster
objects its planning reads, its cluster-wide changes (`ClusterWork`) and what it does on each
node (`NodeWork`). The planner builds one `PlanningContext` per plan and passes it to every
kind and every step's `plan`: whatever planning computes once and reads many times is kept
there, so two plans in one process share nothing.

The rest of the product asks the kinds too, each question a hook with a default that does
nothing, so that no shared module names a kind: the facts its change needs of each node
(`node_reads`, `node_files`, `reads_nvidia_drivers`, asked through rollout.changes, below
this module), the API grants that depend on its change (`grants`, rollout.schedule), and
what happens once a run ends (`clean_up_run`, `run_notes`, rollout.cli.runsummary).
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, TypeVar

from rollout.changes import kind_planners
from rollout.commands import CommandRunner
from rollout.facts import ClusterFacts, FleetFacts, NodeFacts
from rollout.facts.extra import NodeRead
from rollout.facts.gpu_operator import physical_gpus
from rollout.facts.pods import advertised_now
from rollout.plan import Advertised, ClusterChange, LabelChange, NodePlan, Plan
from rollout.rbac import Grant
from rollout.run.state import RunState

V = TypeVar("V")
W = TypeVar("W", bound="NodeWork")


@dataclass(frozen=True)
class NodeWork:
    """What one change kind does on one node; a kind subclasses it to carry its own data."""

    # anything on the node itself changes (files, a label, the device plugin)
    touches_node: bool = False
    # workloads must leave the node first (cordon and drain)
    disruptive: bool = False
    restarts_containerd: bool = False
    # a cluster-wide object of the kind (a ConfigMap, the ClusterPolicy) is still to change:
    # every target's preflight checks the node
    cluster_pending: bool = False
    labels: tuple[LabelChange, ...] = ()
    # what a reviewer must know of the node (shown with the node's warnings)
    notes: tuple[str, ...] = ()

    def add_to(self, plan: NodePlan) -> NodePlan:
        """The node's plan with what the kind shows of its own (files, a driver change)."""
        return plan


@dataclass(frozen=True)
class ClusterWork:
    """What one change kind changes cluster-wide (before wave 1), and what a reviewer must know."""

    changes: tuple[ClusterChange, ...] = ()
    warnings: tuple[str, ...] = ()


class ChangeKindPlanner(abc.ABC):
    """One change kind, as the planner asks it: registered once in rollout.changes.KINDS."""

    # its key under `changes:` (`registry`, `time-slicing`, ...)
    key: ClassVar[str]
    # its pydantic plan model: what the key's mapping is read into
    model: ClassVar[type]
    # kinds that plan their nodes together share one key here (registry and containerd run
    # one engine over both): the context computes that work once per node
    work_key: ClassVar[str] = ""

    # the kind's work is planned on every node, in a plan without its change too (the change
    # is then None): containerd's engine reads each node's files and shows their shadowing
    describes_every_node: ClassVar[bool] = False

    @classmethod
    def shared_work_key(cls) -> str:
        return cls.work_key or cls.key

    @abc.abstractmethod
    def playbook(self, change: Any) -> str:
        """The playbook (rollout/playbooks/<name>.yaml) that applies this change."""

    @abc.abstractmethod
    def step_modules(self) -> tuple[ModuleType, ...]:
        """The modules defining the kind's own steps (the shared steps are not listed)."""

    def cluster_reads(
        self, change: Any, cluster_policy: Mapping[str, Any]
    ) -> tuple[tuple[str, str], ...]:
        """The ConfigMaps (namespace, name) the kind's planning reads from the cluster."""
        return ()

    def node_reads(self, change: Any) -> tuple[NodeRead, ...]:
        """The extra facts the change needs of every node, read once the nodes are probed."""
        return ()

    def node_files(self, change: Any) -> tuple[str, ...]:
        """The files outside /etc/containerd the change writes: each node's one probe reads
        them with its containerd files (the plan's `before` of each)."""
        return ()

    def reads_nvidia_drivers(self, change: Any) -> bool:
        """True when the kind plans from the cluster's NVIDIADriver resources."""
        return False

    def grants(self, change: Any, step_kinds: Collection[str]) -> tuple[Grant, ...]:
        """What a run of the change asks of the API beyond its steps' own grants: what depends
        on the change (a ConfigMap's namespace, where a version is written); `step_kinds` are
        the plan's."""
        return ()

    def clean_up_run(
        self, change: Any, plan: Plan, runners: Mapping[str, CommandRunner], run_id: str
    ) -> dict[str, str]:
        """Remove what the run may have left on the nodes (a killed attempt's staging), once
        the run ends; {node: what was not removed, and why} where it could not. Asked of
        each planned kind (`change` None: a kind that describes every node, and the plan
        has no change of it)."""
        return {}

    def run_notes(
        self, change: Any, plan: Plan, spec: Any, outcome: str, state: RunState
    ) -> list[str]:
        """What the run summary says loudly once the run ended with `outcome` (the run's
        journal replayed: `state`); asked as `clean_up_run` is."""
        return []

    def prepare(self, ctx: PlanningContext, change: Any) -> None:
        """Work done once before the nodes are planned (the engine runs of distinct nodes)."""
        return None

    def plan_cluster(self, ctx: PlanningContext, change: Any) -> ClusterWork:
        """The kind's cluster-wide changes and warnings for the plan."""
        return ClusterWork()

    @abc.abstractmethod
    def plan_node(self, ctx: PlanningContext, change: Any, node: NodeFacts) -> NodeWork:
        """What the change does on the node (raises the node's planning error, located)."""

    def advertises(
        self, ctx: PlanningContext, change: Any, node: NodeFacts, now: Mapping[str, int]
    ) -> Advertised:
        """The node's GPU resources once the change is made (rollout.capacity): the model's
        own rule, unless the kind needs the cluster to say it (a MIG layout's devices)."""
        return change.advertises(now, physical_gpus(node))  # type: ignore[no-any-return]


def kind_of(kinds: Mapping[str, ChangeKindPlanner], change: Any) -> ChangeKindPlanner:
    """The kind among `kinds` whose model the change is."""
    for kind in kinds.values():
        if isinstance(change, kind.model):
            return kind
    raise LookupError(f"no change kind registered for {type(change).__name__}")


def planned_kinds(
    kinds: Mapping[str, ChangeKindPlanner], changes: Sequence[Any]
) -> list[tuple[str, ChangeKindPlanner, Any]]:
    """(work key, kind, its first change) of each kind that plans here, the kinds that
    describe every node first (their change None where the plan has none)."""
    found: dict[str, tuple[ChangeKindPlanner, Any]] = {}
    for kind in kinds.values():
        if kind.describes_every_node:
            found.setdefault(kind.shared_work_key(), (kind, None))
    for change in changes:
        kind = kind_of(kinds, change)
        key = kind.shared_work_key()
        if key not in found or found[key][1] is None:
            found[key] = (kind, change)
    return [(key, kind, change) for key, (kind, change) in found.items()]


def clean_up_run(
    kinds: Mapping[str, ChangeKindPlanner],
    plan: Plan,
    spec: Any,
    runners: Mapping[str, CommandRunner],
    run_id: str,
) -> dict[str, str]:
    """Each planned kind's `clean_up_run` after a run: {node: why not} where one could not."""
    problems: dict[str, str] = {}
    for _, kind, change in planned_kinds(kinds, spec.changes):
        problems.update(kind.clean_up_run(change, plan, runners, run_id))
    return problems


def run_notes(
    kinds: Mapping[str, ChangeKindPlanner], plan: Plan, spec: Any, outcome: str, state: RunState
) -> list[str]:
    """Each planned kind's notes for the run summary, in plan order."""
    return [
        note
        for _, kind, change in planned_kinds(kinds, spec.changes)
        for note in kind.run_notes(change, plan, spec, outcome, state)
    ]


class _Same:
    """A memo key part that is one object by identity (facts are not hashable), kept alive
    with the entry so its id cannot be reused meanwhile."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value


def same(value: object) -> Hashable:
    """A key part standing for `value` itself (by identity), for PlanningContext.memo."""
    return _Same(value)


class PlanningContext:
    """One plan's inputs and everything planning keeps while it runs.

    `memo` is the only cache planning has: a value is computed once per context (errors are
    not kept, so a failing node reports itself each time it is asked).
    """

    def __init__(
        self,
        spec: Any,
        fleet: FleetFacts,
        kinds: Mapping[str, ChangeKindPlanner] | None = None,
        targets: Sequence[NodeFacts] = (),
        budget: int = 0,
    ) -> None:
        self.spec = spec
        self.fleet = fleet
        # the registered kinds unless given (a test's own kinds)
        self.kinds = kind_planners() if kinds is None else kinds
        self.targets = tuple(targets)
        self.budget = budget
        self._values: dict[Hashable, Any] = {}
        self._lock = threading.Lock()

    @property
    def cluster(self) -> ClusterFacts:
        return self.fleet.cluster

    def memo(self, key: Hashable, compute: Callable[[], V]) -> V:
        """The value kept under `key`, else `compute()` kept (computed outside the lock)."""
        with self._lock:
            if key in self._values:
                return self._values[key]  # type: ignore[no-any-return]
        value = compute()
        with self._lock:
            return self._values.setdefault(key, value)  # type: ignore[no-any-return]

    def kind_of(self, change: Any) -> ChangeKindPlanner:
        """The registered kind whose model the change is."""
        return kind_of(self.kinds, change)

    def node_memo(self, name: str, node: NodeFacts, compute: Callable[[], V]) -> V:
        """`memo` for a value of one node (facts by identity: they are not hashable)."""
        return self.memo((name, same(node)), compute)

    def work(self, node: NodeFacts, key: str) -> NodeWork:
        """That kind's work on the node, computed once per context (none: NodeWork())."""
        return self.node_memo(f"work {key}", node, lambda: self._plan_work(node, key))

    def work_as(self, node: NodeFacts, key: str, shape: type[W], empty: W) -> W:
        """The kind's work on the node as the kind's own NodeWork class (`empty` when the
        plan has no change of that kind)."""
        found = self.work(node, key)
        return found if isinstance(found, shape) else empty

    def all_work(self, node: NodeFacts) -> tuple[NodeWork, ...]:
        """The work of every kind the plan has on the node (and of the kinds that describe
        every node), once per work key, in plan order."""
        return tuple(self.work(node, key) for key, _, _ in self.planned_kinds())

    def planned_kinds(self) -> list[tuple[str, ChangeKindPlanner, Any]]:
        """(work key, kind, its first change) of each kind that plans here, the kinds that
        describe every node first (their change None where the plan has none)."""
        return self.memo(("planned kinds",), lambda: planned_kinds(self.kinds, self.spec.changes))

    def advertised(self, node: NodeFacts) -> Advertised:
        """The node's GPU resources once every change of the plan is made, from what it
        advertises now (rollout.facts.pods.advertised_now): each change's kind in plan order,
        their caveats gathered; once per node and context (rollout.capacity's forecast, and
        the plans of gpu.wait and the gates, read it)."""

        def compute() -> Advertised:
            counts: Mapping[str, int] = advertised_now(node.capacity, node.allocatable)
            caveats: list[str] = []
            for change in self.spec.changes:
                made = self.kind_of(change).advertises(self, change, node, counts)
                counts = made.counts
                caveats.extend(made.caveats)
            return Advertised(counts, tuple(caveats))

        return self.node_memo("advertised", node, compute)

    def cluster_work(self) -> tuple[ClusterWork, ...]:
        """Every change's cluster-wide work, in plan order, computed once per context."""
        return self.memo(
            ("cluster work",),
            lambda: tuple(self.kind_of(c).plan_cluster(self, c) for c in self.spec.changes),
        )

    def _plan_work(self, node: NodeFacts, key: str) -> NodeWork:
        for planned, kind, change in self.planned_kinds():
            if planned == key:
                return kind.plan_node(self, change, node)
        return NodeWork()

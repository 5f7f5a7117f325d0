"""What a plan changes on one node, decided once and read by every step's `plan`.

Several steps hang on the same node-wide facts: cordon, drain and uncordon act only where
containerd restarts; preflight and the GPU checks act wherever anything on the node changes.
Those answers are computed here once per (spec, node, cluster) so that no step re-derives
them its own way.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
from typing import ClassVar

from rollout.facts import ClusterFacts, NodeFacts
from rollout.memo import IdentityMemo
from rollout.plan import ClusterChange, StepPlan
from rollout.spec import Spec
from rollout.steps.base import StepContext, StepResult, translate_step_errors
from rollout.steps.containerd_changes import ContainerdChanges, plan_containerd
from rollout.steps.driver_host import host_driver_pending
from rollout.steps.driver_operator_plan import operator_driver_pending
from rollout.steps.profile_changes import ProfileChange, plan_cluster_changes, plan_profile

# Planning one node reads every step; the cache keeps the answer for the node being planned
# (and a few more) without holding a whole fleet's results.
_CACHE_SIZE = 64
# The step that writes containerd's files; the steps after it read the data it saves.
WRITE_STEP = "containerd.write"


@dataclass(frozen=True)
class NodeChanges:
    """The node's containerd writes, its time-slicing change and the cluster-wide changes."""

    containerd: ContainerdChanges
    profile: ProfileChange
    cluster: tuple[ClusterChange, ...]
    # a host-mode driver upgrade has work on the node (rollout.steps.driver_host)
    driver_host: bool = False
    # the GPU Operator upgrades this node's driver (rollout.steps.driver_operator): nothing
    # for rollout to cordon, but the node changes and its smoke pod must see the new driver
    driver_operator: bool = False

    @property
    def restarts_containerd(self) -> bool:
        return bool(self.containerd.files)

    @property
    def disruptive(self) -> bool:
        """Whether workloads must leave the node first (cordon and drain)."""
        return self.restarts_containerd or self.driver_host

    @property
    def touches_node(self) -> bool:
        """Whether anything on the node itself changes (files, label, device plugin)."""
        return (
            self.restarts_containerd
            or self.profile.changes_node
            or self.driver_host
            or self.driver_operator
        )

    @property
    def cluster_pending(self) -> bool:
        """Whether a cluster-wide object (ConfigMap, ClusterPolicy) still has to change."""
        return any(c.action is not None for c in self.cluster)


_memo: IdentityMemo[NodeChanges] = IdentityMemo(_CACHE_SIZE)


def node_changes(facts: NodeFacts, cluster: ClusterFacts, spec: Spec) -> NodeChanges:
    """What the spec changes on this node; the same objects give the same (cached) answer."""
    return _memo.get_or_compute(
        (spec, facts, cluster),
        lambda: NodeChanges(
            containerd=plan_containerd(spec, facts),
            profile=plan_profile(spec, facts, cluster),
            cluster=tuple(plan_cluster_changes(spec, cluster)),
            driver_host=host_driver_pending(spec, facts),
            driver_operator=operator_driver_pending(spec, facts),
        ),
    )


class Reach(enum.Enum):
    """Which of a node's changes a step acts on; the value is the step's reason to skip."""

    CONTAINERD = "no containerd file changes"
    WORKLOADS = "nothing restarts on this node"
    NODE = "nothing changed on this node"

    def found_in(self, changes: NodeChanges) -> bool:
        if self is Reach.CONTAINERD:
            return changes.restarts_containerd
        if self is Reach.WORKLOADS:
            return changes.disruptive
        return changes.touches_node


class ReachingStep(abc.ABC):
    """A step whose plan skips it where the node has no change of its reach."""

    kind: ClassVar[str]
    reach: ClassVar[Reach]

    def plan(self, facts: NodeFacts, cluster: ClusterFacts, spec: Spec) -> StepPlan:
        if not self.reach.found_in(node_changes(facts, cluster, spec)):
            return StepPlan.skipping(self.kind, self.reach.value)
        return self.plan_change(facts, spec)

    @abc.abstractmethod
    def plan_change(self, facts: NodeFacts, spec: Spec) -> StepPlan:
        """The plan where the node has a change of the step's reach."""


class ContainerdFileStep(ReachingStep):
    """A step after containerd.write: it acts only where the plan writes containerd files,
    does `action` there, and fails on a node error (a transient one goes to the retry
    policy, whose retry finds what the first attempt did)."""

    reach: ClassVar[Reach] = Reach.CONTAINERD
    action: ClassVar[str]

    def plan_change(self, facts: NodeFacts, spec: Spec) -> StepPlan:
        return StepPlan.acting(self.kind, self.action)

    def apply(self, ctx: StepContext) -> StepResult:
        if not ctx.node_plan.files:
            return StepResult.noop(self.reach.value)
        with translate_step_errors(ctx.node, self.kind):
            return self.act(ctx)

    @abc.abstractmethod
    def act(self, ctx: StepContext) -> StepResult:
        """The step's work, on a node whose plan writes containerd files."""

"""What a plan changes on one node, decided once and read by every step's `plan`.

Several steps hang on the same node-wide facts: cordon, drain and uncordon act only where
workloads must leave; preflight and the GPU checks act wherever anything on the node changes.
Those answers are the work of every change kind of the plan on the node (NodeWork), asked of
the planning context once per node, so that no step re-derives them its own way.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
from typing import ClassVar

from rollout.changes.base import NodeWork, PlanningContext
from rollout.facts import NodeFacts
from rollout.plan import StepPlan
from rollout.spec import Spec
from rollout.steps.base import StepContext, StepResult, translate_step_errors

# The step that writes containerd's files; the steps after it read the data it saves.
WRITE_STEP = "containerd.write"


@dataclass(frozen=True)
class NodeChanges:
    """The work of every change kind of the plan on one node, read as one."""

    work: tuple[NodeWork, ...]

    @property
    def restarts_containerd(self) -> bool:
        return any(w.restarts_containerd for w in self.work)

    @property
    def disruptive(self) -> bool:
        """Whether workloads must leave the node first (cordon and drain)."""
        return any(w.disruptive for w in self.work)

    @property
    def touches_node(self) -> bool:
        """Whether anything on the node itself changes (files, label, device plugin)."""
        return any(w.touches_node for w in self.work)

    @property
    def cluster_pending(self) -> bool:
        """Whether a cluster-wide object (ConfigMap, ClusterPolicy) still has to change."""
        return any(w.cluster_pending for w in self.work)


def node_changes(ctx: PlanningContext, facts: NodeFacts) -> NodeChanges:
    """What the plan changes on this node, computed once per planning context."""
    return ctx.node_memo("node changes", facts, lambda: NodeChanges(ctx.all_work(facts)))


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

    def plan(self, ctx: PlanningContext, facts: NodeFacts) -> StepPlan:
        if not self.reach.found_in(node_changes(ctx, facts)):
            return StepPlan.skipping(self.kind, self.reach.value)
        return self.plan_change(facts, ctx.spec)

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

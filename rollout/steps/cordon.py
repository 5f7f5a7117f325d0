"""cordon and uncordon: take a node out of scheduling and give it back, only where rollout took it.

Safety invariant 4 lives here: the journal, not the node, says whether rollout cordoned a
node, and a node someone else cordoned is never uncordoned. Every read is fresh, so each
step is safe to repeat on resume, and each proves its patch by reading it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

from rollout.changes.base import PlanningContext
from rollout.facts import NodeFacts
from rollout.plan import StepPlan
from rollout.rbac import grants_of
from rollout.run import CordonedByRollout, Uncordoned
from rollout.spec import Spec
from rollout.steps.base import StepContext, StepFailed, StepResult
from rollout.steps.gates import gates_after_rollback
from rollout.steps.nodechanges import Reach, ReachingStep, node_changes
from rollout.steps.nodemarks import LEFT_CORDONED_ANNOTATION, MarkingStep, mark_released
from rollout.steps.traits import StepTraits, bounded_by_requests


class CordonOwner(Enum):
    """Whose cordon a node carries; the value is what the plan and the steps say of it."""

    NOBODY = "schedulable"
    THIS_RUN = "already cordoned by this run"
    SOMEONE_ELSE = "cordoned by someone else; stays cordoned"


def cordon_owner(unschedulable: bool, cordoned_by_rollout: bool) -> CordonOwner:
    """Invariant 4's rule, the one place it is written: a node unschedulable without this
    run's journalled cordon was cordoned by someone else, and rollout never uncordons it.
    Planning knows no journal yet (`cordoned_by_rollout` False)."""
    if not unschedulable:
        return CordonOwner.NOBODY
    return CordonOwner.THIS_RUN if cordoned_by_rollout else CordonOwner.SOMEONE_ELSE


@dataclass(frozen=True)
class CordonStep(ReachingStep, MarkingStep):
    """Mark the node unschedulable, journalled first, unless someone else already did."""

    kind: ClassVar[str] = "cordon"
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=True,
        uses_ssh=False,
        grants=grants_of("", "nodes", "get patch"),
        expected_s=1.0,
        worst_s=bounded_by_requests,
    )
    reach: ClassVar[Reach] = Reach.WORKLOADS

    def plan_change(self, facts: NodeFacts, spec: Spec) -> StepPlan:
        owner = cordon_owner(facts.unschedulable, cordoned_by_rollout=False)
        if owner is CordonOwner.SOMEONE_ELSE:
            return StepPlan.skipping(self.kind, owner.value)
        return StepPlan.acting(self.kind, "mark the node unschedulable")

    def _apply(self, ctx: StepContext) -> StepResult:
        node = ctx.kube.get_node(ctx.node)
        ours = ctx.journal.replay().node(ctx.node).cordoned_by_rollout
        owner = cordon_owner(node.unschedulable, ours)
        if owner is CordonOwner.SOMEONE_ELSE:
            ctx.save_data(self.kind, {"cordoned_by_rollout": False, "cordoned_before": True})
            return StepResult.noop(owner.value)
        if owner is CordonOwner.THIS_RUN:
            ctx.save_data(self.kind, {"cordoned_by_rollout": True, "cordoned_before": False})
            return StepResult.noop(owner.value)
        # The record goes first: a kill between it and the patch leaves a record of a cordon
        # that may have happened, which resume and rollback can act on; the other order
        # could leave a node cordoned with nothing saying rollout did it.
        ctx.journal.append(CordonedByRollout(node=ctx.node))
        ctx.save_data(self.kind, {"cordoned_by_rollout": True, "cordoned_before": False})
        ctx.kube.set_unschedulable(ctx.node, True)
        if not ctx.kube.get_node(ctx.node).unschedulable:
            raise StepFailed(
                ctx.node,
                self.kind,
                "the node still reads as schedulable after the cordon patch: check for a "
                "controller that uncordons nodes (an autoscaler, another rollout)",
            )
        return StepResult.done("marked unschedulable")

    def undo(self, ctx: StepContext) -> None:
        if ctx.journal.replay().node(ctx.node).cordoned_by_rollout:
            # invariant 10: back in service only with its health gates passing
            gates_after_rollback(ctx, self.kind)
            uncordon_node(ctx, self.kind)


def uncordon_node(ctx: StepContext, kind: str) -> None:
    """Mark the node schedulable, verify it, journal that rollout's cordon is gone, and
    remove a left-cordoned mark an earlier failed rollback put on the node."""
    ctx.kube.set_unschedulable(ctx.node, False)
    node = ctx.kube.get_node(ctx.node)
    if node.unschedulable:
        raise StepFailed(
            ctx.node, kind, "the node still reads as unschedulable after the uncordon patch"
        )
    # After the patch: a kill in between leaves the journal saying "cordoned by rollout",
    # and a resume simply uncordons again.
    ctx.journal.append(Uncordoned(node=ctx.node))
    mark_released(ctx, node.annotations.get(LEFT_CORDONED_ANNOTATION))


@dataclass(frozen=True)
class UncordonStep(MarkingStep):
    """Make the node schedulable again, only where rollout cordoned it (invariant 4)."""

    kind: ClassVar[str] = "uncordon"
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=False,
        grants=grants_of("", "nodes", "get patch"),
        expected_s=1.0,
        worst_s=bounded_by_requests,
    )

    def plan(self, ctx: PlanningContext, facts: NodeFacts) -> StepPlan:
        if node_changes(ctx, facts).disruptive and not facts.unschedulable:
            return StepPlan.acting(self.kind, "mark the node schedulable again")
        owner = cordon_owner(facts.unschedulable, cordoned_by_rollout=False)
        if owner is CordonOwner.SOMEONE_ELSE:
            return StepPlan.skipping(self.kind, owner.value)
        return StepPlan.skipping(self.kind, "rollout does not cordon this node")

    def _apply(self, ctx: StepContext) -> StepResult:
        if not ctx.journal.replay().node(ctx.node).cordoned_by_rollout:
            cordon = ctx.load_data(CordonStep.kind)
            if cordon.get("cordoned_before"):
                return StepResult.noop(CordonOwner.SOMEONE_ELSE.value)
            if cordon.get("cordoned_by_rollout"):
                return StepResult.noop("already uncordoned by this run")
            return StepResult.noop("rollout did not cordon this node")
        uncordon_node(ctx, self.kind)
        ctx.save_data(self.kind, {"uncordoned": True})
        return StepResult.done("marked schedulable again")

    def undo(self, ctx: StepContext) -> None:
        if not ctx.load_data(self.kind).get("uncordoned"):
            return
        if ctx.journal.replay().node(ctx.node).cordoned_by_rollout:
            return  # already cordoned again by an earlier undo
        ctx.journal.append(CordonedByRollout(node=ctx.node))
        ctx.kube.set_unschedulable(ctx.node, True)
        ctx.save_data(self.kind, {"uncordoned": False})

"""preflight: before rollout touches a node, the node must be the one it planned for.

Refuses (nothing changed yet) when the node is NotReady, when containerd is not running, or
when the containerd version differs from the plan's (the plan's, not facts gathered again by
a resumed run). A node already advertising fewer
GPUs than it has is not refused — that may be exactly what the plan repairs — but the
baseline is reported in the step's result, so a later failure can be told apart from an
earlier one.
"""

from __future__ import annotations

from typing import ClassVar

from rollout.changes.base import PlanningContext
from rollout.facts import (
    ContainerdChanged,
    ContainerdVersionFact,
    NodeFacts,
    check_containerd_version,
    read_fact,
)
from rollout.facts.pods import GPU_RESOURCE
from rollout.plan import StepPlan
from rollout.rbac import grants_of
from rollout.steps.base import StepContext, StepFailed, StepResult
from rollout.steps.nodechanges import node_changes
from rollout.steps.systemd import probe_service
from rollout.steps.traits import StepTraits, bounded_by_requests


class Preflight:
    """Check the node before the first change; report its GPU baseline."""

    kind: ClassVar[str] = "preflight"
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=True,
        grants=grants_of("", "nodes", "get"),
        expected_s=2.0,
        worst_s=bounded_by_requests,
    )

    def plan(self, ctx: PlanningContext, facts: NodeFacts) -> StepPlan:
        changes = node_changes(ctx, facts)
        if changes.touches_node or changes.cluster_pending:
            return StepPlan.acting(
                self.kind, "check the node is Ready and containerd runs as planned"
            )
        return StepPlan.skipping(self.kind, "nothing changes on this node")

    def apply(self, ctx: StepContext) -> StepResult:
        node = ctx.kube.get_node(ctx.node)
        # containerd first: a stopped runtime is also why the kubelet reports NotReady
        service = probe_service(ctx.runner)
        if not service.running:
            raise StepFailed(
                ctx.node,
                self.kind,
                f"containerd is not running before any change ({service.describe()}); "
                "check `systemctl status containerd` on the node"
                + ("" if node.ready else " (the node is NotReady too)"),
            )
        if not node.ready:
            raise StepFailed(
                ctx.node, self.kind, "the node is NotReady before any change; fix it first"
            )
        version = read_fact(ctx.runner, ContainerdVersionFact())
        try:
            check_containerd_version(ctx.node_plan.containerd_version, version)
        except ContainerdChanged as exc:
            raise StepFailed(ctx.node, self.kind, str(exc)) from exc
        allocatable = node.allocatable.get(GPU_RESOURCE, "0")
        return StepResult.done(
            f"Ready, containerd {version} {service.describe()}, "
            f"{GPU_RESOURCE} allocatable {allocatable}"
        )

    def undo(self, ctx: StepContext) -> None:
        """Nothing to put back: preflight only reads."""

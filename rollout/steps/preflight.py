"""preflight: before rollout touches a node, the node must be the one it planned for.

Refuses (nothing changed yet) when the node is NotReady, when containerd is not running, or
when the containerd version differs from the plan's facts. A node already advertising fewer
GPUs than it has is not refused — that may be exactly what the plan repairs — but the
baseline is recorded, so a later failure can be told apart from an earlier one.
"""

from __future__ import annotations

from typing import ClassVar

from rollout.commands import check
from rollout.containerd import parse_version
from rollout.facts import ClusterFacts, NodeFacts
from rollout.plan import StepPlan
from rollout.spec import Spec
from rollout.steps.base import StepContext, StepFailed, StepResult
from rollout.steps.nodechanges import node_changes
from rollout.steps.systemd import probe_service

GPU_RESOURCE = "nvidia.com/gpu"


class Preflight:
    """Check the node before the first change; record its GPU baseline."""

    kind: ClassVar[str] = "preflight"

    def plan(self, facts: NodeFacts, cluster: ClusterFacts, spec: Spec) -> StepPlan:
        changes = node_changes(facts, cluster, spec)
        if changes.touches_node or changes.cluster_pending:
            return StepPlan.acting(
                self.kind, "check the node is Ready and containerd runs as planned"
            )
        return StepPlan.skipping(self.kind, "nothing changes on this node")

    def apply(self, ctx: StepContext) -> StepResult:
        node = ctx.kube.get_node(ctx.node)
        if not node.ready:
            raise StepFailed(
                ctx.node, self.kind, "the node is NotReady before any change; fix it first"
            )
        service = probe_service(ctx.runner)
        if not service.running:
            raise StepFailed(
                ctx.node,
                self.kind,
                f"containerd is not running before any change ({service.describe()}); "
                "check `systemctl status containerd` on the node",
            )
        output = check(ctx.runner.run(["containerd", "--version"]), "read the containerd version")
        version = parse_version(output.stdout)
        planned = ctx.facts.containerd
        if (version.major, version.minor, version.patch) != (
            planned.major,
            planned.minor,
            planned.patch,
        ):
            raise StepFailed(
                ctx.node,
                self.kind,
                f"containerd is {version} now, the plan was made for {planned}; "
                "run `rollout plan` again",
            )
        allocatable = node.allocatable.get(GPU_RESOURCE, "0")
        ctx.save_data(
            self.kind,
            {
                "allocatable_gpus": allocatable,
                "capacity_gpus": node.capacity.get(GPU_RESOURCE, "0"),
                "main_pid": service.main_pid,
            },
        )
        return StepResult.done(
            f"Ready, containerd {version} {service.describe()}, "
            f"{GPU_RESOURCE} allocatable {allocatable}"
        )

    def undo(self, ctx: StepContext) -> None:
        """Nothing to put back: preflight only reads."""

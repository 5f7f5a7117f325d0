"""Wait for the GPU Operator to settle after rollout changed its ClusterPolicy.

A ClusterPolicy write is cluster-wide: the operator re-renders its operand DaemonSets and
rolls those whose rendering changes (the device plugin and GPU feature discovery for a new
`devicePlugin.config`; the toolkit only for its own sections, and each toolkit run restarts
containerd through SIGHUP, taking its node NotReady for containerd's RestartSec: see
`rollout.operatorrolls`). Starting the next node inside that window would
count nodes the operator is restarting against max_unavailable, or find containerd between
its stop and its start. So `configmap.update` waits until every DaemonSet of the operator's
namespace has rolled out (updated = ready = desired) and every GPU node is Ready, and stays
so for SETTLE_S: the operator's reconcile may start a rollout a moment after the write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollout.facts.gpu_operator import GPU_PRESENT_LABEL
from rollout.steps.base import StepContext, StepFailed
from rollout.steps.deadline import POLL_INTERVAL_S

if TYPE_CHECKING:  # plan --facts loads the steps without the Kubernetes client
    from rollout.transports.kube import DaemonSet, Node

# Longer than containerd's RestartSec (5 s on Debian) plus the operator's reaction to a write.
SETTLE_S = 10.0


def wait_for_operands(ctx: StepContext, kind: str, namespace: str) -> str:
    """Block until the operator's DaemonSets and the GPU nodes are settled; what was seen."""
    deadline = ctx.deadline(ctx.spec.policy.verify.gpu_wait_timeout_s)
    settled_since: float | None = None
    unsettled_seen = False
    while True:
        waiting = unsettled_operands(
            ctx.kube.list_daemonsets(namespace), ctx.kube.list_nodes(f"{GPU_PRESENT_LABEL}=true")
        )
        if waiting:
            unsettled_seen = True
            settled_since = None
        elif settled_since is None:
            settled_since = deadline.elapsed_s
        elif deadline.elapsed_s - settled_since >= SETTLE_S:
            what = "rolled out its operands" if unsettled_seen else "restarted no operand"
            return f"the GPU Operator {what}; GPU nodes Ready ({round(deadline.elapsed_s)}s)"
        if deadline.expired:
            raise StepFailed(
                ctx.node,
                kind,
                f"the GPU Operator did not settle within {round(deadline.elapsed_s)}s after "
                f"the ClusterPolicy change: {'; '.join(waiting) or 'still changing'}",
            )
        deadline.sleep(POLL_INTERVAL_S)


def unsettled_operands(daemonsets: list[DaemonSet], nodes: list[Node]) -> list[str]:
    """What is still moving: DaemonSets mid-rollout, GPU nodes not Ready."""
    waiting = [
        f"daemonset {d.name}: {d.updated} updated, {d.ready} ready of {d.desired}"
        for d in daemonsets
        if not d.desired == d.updated == d.ready
    ]
    waiting += [f"node {n.name} NotReady" for n in nodes if not n.ready]
    return waiting

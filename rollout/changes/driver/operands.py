"""Steps `driver.pause` and `driver.resume`: the GPU Operator's operands leave the node while
its host-installed driver changes, and come back after.

As NVIDIA's driver manager does (FACTS.md "Host-installed drivers"): every
`nvidia.com/gpu.deploy.<operand>` label that is `true` becomes `paused-for-driver-upgrade`
(the operand's DaemonSet selects `true`, so its pod leaves); a label that is `false`, or
anything else, is kept as it is. The originals are saved (StepContext.save_data of
driver.pause: `originals`, every deploy label as found; `paused`, the keys set to paused)
before the first patch, so `driver.resume`, an undo and a resumed run put back exactly what
was there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from rollout.changes.base import PlanningContext
from rollout.changes.driver.hostplan import plan_pending_host_driver, running_operands
from rollout.driver.operator import OPERAND_PAUSED
from rollout.facts import NodeFacts
from rollout.operatornames import DEPLOY_LABEL_PREFIX
from rollout.plan import StepPlan
from rollout.rbac import grants_of
from rollout.steps.base import StepContext, StepFailed, StepResult
from rollout.steps.deadline import POLL_INTERVAL_S
from rollout.steps.nodemarks import MarkingStep
from rollout.steps.pods import describe_pod
from rollout.steps.traits import StepTraits, bounded_by_requests
from rollout.transports.kube import Pod

PAUSE_STEP = "driver.pause"


def deploy_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """Every operand deploy label of a node, with its value."""
    return {k: v for k, v in labels.items() if k.startswith(DEPLOY_LABEL_PREFIX)}


def operand_pods(ctx: StepContext, keys: Sequence[str]) -> list[Pod]:
    """The pods on the node that an operand's deploy label (one of `keys`) put there."""
    pods = ctx.kube.list_pods(None, field_selector=f"spec.nodeName={ctx.node}")
    return [
        p
        for p in pods
        if p.phase not in ("Succeeded", "Failed")
        and any(p.node_selector.get(key) == "true" for key in keys)
    ]


def pause_operands(ctx: StepContext, kind: str) -> list[str]:
    """Record the deploy labels (once), pause those that are `true`, wait for their pods
    to leave; the keys paused."""
    saved = ctx.load_data(PAUSE_STEP)
    originals = saved.get("originals")
    if not isinstance(originals, dict):
        originals = deploy_labels(ctx.kube.get_node(ctx.node).labels)
        saved = {"originals": originals, "paused": list(running_operands(originals))}
        ctx.save_data(PAUSE_STEP, saved)  # before the first patch: undo must know
    paused = [str(k) for k in saved.get("paused", [])]
    if paused:
        ctx.kube.patch_node_labels(ctx.node, dict.fromkeys(paused, OPERAND_PAUSED))
        now = ctx.kube.get_node(ctx.node).labels
        unpaused = [k for k in paused if now.get(k) != OPERAND_PAUSED]
        if unpaused:
            raise StepFailed(
                ctx.node,
                kind,
                f"{', '.join(unpaused)} did not read back as {OPERAND_PAUSED}: is the GPU Operator "
                "(or another tool) setting deploy labels on the node?",
            )
    wait_for_operands_gone(ctx, kind, paused)
    return paused


def wait_for_operands_gone(ctx: StepContext, kind: str, keys: Sequence[str]) -> None:
    timeout_s = ctx.spec.policy.driver.operands_timeout_s
    deadline = ctx.deadline(timeout_s)
    while keys:
        left = operand_pods(ctx, keys)
        if not left:
            return
        if deadline.expired:
            raise StepFailed(
                ctx.node,
                kind,
                f"operand pods still on the node after {timeout_s}s "
                "(policy.driver.operands_timeout_s):\n  "
                + "\n  ".join(describe_pod(p) for p in left),
            )
        deadline.sleep(POLL_INTERVAL_S)


def restore_operands(ctx: StepContext, kind: str) -> list[str]:
    """Put back the original value of every deploy label driver.pause paused; the keys."""
    saved = ctx.load_data(PAUSE_STEP)
    originals = saved.get("originals")
    if not isinstance(originals, dict):
        return []
    paused = [str(k) for k in saved.get("paused", [])]
    if paused:
        ctx.kube.patch_node_labels(ctx.node, {k: str(originals[k]) for k in paused})
        now = ctx.kube.get_node(ctx.node).labels
        wrong = [k for k in paused if now.get(k) != originals[k]]
        if wrong:
            raise StepFailed(ctx.node, kind, f"{', '.join(wrong)} did not read back as before")
    return paused


def _plan_operands(kind: str, ctx: PlanningContext, facts: NodeFacts, action: str) -> StepPlan:
    planned = plan_pending_host_driver(kind, ctx, facts)
    if isinstance(planned, StepPlan):
        return planned
    if not planned.operands:
        return StepPlan.skipping(kind, "no operand deploy label is `true` on the node")
    return StepPlan.acting(kind, action.format(labels=", ".join(planned.operands)))


class DriverPause(MarkingStep):
    """Pause the GPU Operator's operands on the node and wait until their pods have left."""

    kind: ClassVar[str] = PAUSE_STEP
    # the operands leave through their nvidia.com/gpu.deploy.* node labels
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=False,
        grants=(*grants_of("", "nodes", "get patch"), *grants_of("", "pods", "list")),
        expected_s=30.0,
        worst_s=bounded_by_requests,
    )

    def plan(self, ctx: PlanningContext, facts: NodeFacts) -> StepPlan:
        return _plan_operands(
            self.kind,
            ctx,
            facts,
            f"set {{labels}} to {OPERAND_PAUSED} (false values kept), wait for their pods to leave",
        )

    def _apply(self, ctx: StepContext) -> StepResult:
        paused = pause_operands(ctx, self.kind)
        if not paused:
            return StepResult.noop("no operand deploy label is `true` on the node")
        kept = sorted(
            k for k, v in ctx.load_data(self.kind).get("originals", {}).items() if v != "true"
        )
        also = f"; kept as they were: {', '.join(kept)}" if kept else ""
        return StepResult.done(f"paused {', '.join(paused)}; their pods have left{also}")

    def undo(self, ctx: StepContext) -> None:
        """The original deploy labels back."""
        restore_operands(ctx, self.kind)


class DriverResume(MarkingStep):
    """The operands' original deploy labels back, after the new driver is verified."""

    kind: ClassVar[str] = "driver.resume"
    # the operands come back through their nvidia.com/gpu.deploy.* node labels
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=False,
        grants=(*grants_of("", "nodes", "get patch"), *grants_of("", "pods", "list")),
        expected_s=30.0,
        worst_s=bounded_by_requests,
    )

    def plan(self, ctx: PlanningContext, facts: NodeFacts) -> StepPlan:
        return _plan_operands(self.kind, ctx, facts, "set {labels} back to true")

    def _apply(self, ctx: StepContext) -> StepResult:
        restored = restore_operands(ctx, self.kind)
        if not restored:
            return StepResult.noop("driver.pause paused no operand")
        return StepResult.done(f"{', '.join(restored)} back to their original values")

    def undo(self, ctx: StepContext) -> None:
        """Pause the operands again: the driver is about to be put back under them."""
        pause_operands(ctx, self.kind)

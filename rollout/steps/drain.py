"""drain: evict the node's pods through the Eviction API, with kubectl drain's rules.

Which pods go is rollout.drain's decision over the transport's `Pod` objects; plan (from
the facts' pods) and apply (from a fresh list) ask the same rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rollout.drain import EvictionBackoff, classify_for_policy, format_blocked
from rollout.facts import NodeFacts
from rollout.plan import StepPlan
from rollout.rbac import grants_of
from rollout.spec import Spec
from rollout.steps.base import StepContext, StepFailed, StepResult
from rollout.steps.deadline import POLL_INTERVAL_S, Deadline
from rollout.steps.nodechanges import Reach, ReachingStep
from rollout.steps.nodemarks import MarkingStep
from rollout.steps.pods import describe_pod, is_pod_gone, read_pod
from rollout.steps.traits import StepTraits
from rollout.transports.errors import EvictionBlocked, TooManyRequests
from rollout.transports.kube import Pod

# drain.timeout_s 0 waits without limit: count a day, the longest timeout a plan accepts.
UNBOUNDED_DRAIN_S = 86_400.0


@dataclass(frozen=True)
class DrainStep(ReachingStep, MarkingStep):
    """Evict the node's pods through the Eviction API, as `kubectl drain` would."""

    kind: ClassVar[str] = "drain"
    # the node's pods leave within their grace period, 30 s by default
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=False,
        grants=(*grants_of("", "pods", "list get"), *grants_of("", "pods/eviction", "create")),
        expected_s=30.0,
        worst_s=lambda policy: float(policy.drain.timeout_s or UNBOUNDED_DRAIN_S),
    )
    reach: ClassVar[Reach] = Reach.WORKLOADS

    def plan_change(self, facts: NodeFacts, spec: Spec) -> StepPlan:
        action, refusal = describe_drain(spec, facts)
        return StepPlan.acting(self.kind, action, tuple(refusal))

    def _apply(self, ctx: StepContext) -> StepResult:
        policy = ctx.spec.policy.drain
        deadline = ctx.deadline(policy.timeout_s)
        pods = ctx.kube.list_pods(None, field_selector=f"spec.nodeName={ctx.node}")
        selection = classify_for_policy(pods, policy)
        if selection.refused:
            raise StepFailed(ctx.node, self.kind, selection.refusal_message())
        by_ref = {(p.namespace, p.name): p for p in pods}
        targets = [by_ref[(r.namespace, r.name)] for r in selection.to_evict]
        staying = f"{len(selection.skipped)} pod(s) stay (DaemonSet, mirror, finished, skipped)"
        if not targets:
            ctx.save_data(self.kind, {"evicted": []})
            return StepResult.noop(f"nothing to evict; {staying}")
        for warning in selection.warnings:
            ctx.progress(f"{ctx.node}: drain: WARNING: {warning}")
        # Pods already terminating are on their way out: wait for them, evict the rest.
        self._evict(ctx, [p for p in targets if not p.deleting], deadline)
        self._wait_until_gone(ctx, targets, deadline)
        names = [f"{p.namespace}/{p.name}" for p in targets]
        ctx.save_data(self.kind, {"evicted": names})
        return StepResult.done(f"evicted {len(names)} pod(s): {', '.join(names)}; {staying}")

    def _evict(self, ctx: StepContext, pods: Sequence[Pod], deadline: Deadline) -> None:
        """Evict every pod; those a budget protects are retried together on the backoff."""
        policy = ctx.spec.policy.drain
        backoff = EvictionBackoff(timeout_s=policy.timeout_s)
        pending = list(pods)
        retry = 0
        while pending:
            refused: list[tuple[Pod, TooManyRequests]] = []
            for pod in pending:
                try:
                    ctx.kube.evict_pod(pod.namespace, pod.name, policy.grace_period_s)
                except TooManyRequests as exc:
                    refused.append((pod, exc))
            if not refused:
                return
            delay_s = backoff.next_delay_s(retry, deadline.elapsed_s)
            if delay_s is None:
                raise StepFailed(
                    ctx.node,
                    self.kind,
                    "\n".join(self._describe_refusal(p, e, deadline) for p, e in refused),
                )
            ctx.progress(
                f"{ctx.node}: drain: {len(refused)} eviction(s) refused, retrying in "
                f"{delay_s:g}s: " + ", ".join(f"{p.namespace}/{p.name}" for p, _ in refused)
            )
            deadline.sleep(delay_s)
            pending = [p for p, _ in refused]
            retry += 1

    @staticmethod
    def _describe_refusal(pod: Pod, error: TooManyRequests, deadline: Deadline) -> str:
        if isinstance(error, EvictionBlocked):
            return format_blocked(pod, error.pdb, deadline.elapsed_s)
        return (
            f"drain of {pod.node_name} timed out after {round(deadline.elapsed_s)}s: the "
            f"eviction of pod {pod.namespace}/{pod.name} kept being refused: {error}"
        )

    def _wait_until_gone(self, ctx: StepContext, pods: Sequence[Pod], deadline: Deadline) -> None:
        remaining = list(pods)
        while True:
            remaining = [p for p in remaining if not is_pod_gone(p, read_pod(ctx, p))]
            if not remaining:
                return
            if deadline.expired:
                still = [read_pod(ctx, p) or p for p in remaining]
                raise StepFailed(
                    ctx.node,
                    self.kind,
                    f"drain timed out after {round(deadline.elapsed_s)}s: {len(still)} evicted "
                    "pod(s) still on the node (policy.drain.timeout_s, or the pods' "
                    "terminationGracePeriodSeconds):\n  " + "\n  ".join(map(describe_pod, still)),
                )
            deadline.sleep(POLL_INTERVAL_S)

    def undo(self, ctx: StepContext) -> None:
        """Nothing to put back: the pods' controllers reschedule them once the node is open."""


def describe_drain(spec: Spec, node: NodeFacts) -> tuple[str, list[str]]:
    """The drain's action from the node's pods (live facts), and why it would refuse."""
    if not node.pods:
        return "evict pods through the Eviction API", []
    selection = classify_for_policy(node.pods, spec.policy.drain)
    gpus = {(p.namespace, p.name): p.gpu_request for p in node.pods}
    names = [
        f"{p.namespace}/{p.name}"
        + (f" ({gpus[(p.namespace, p.name)]} GPU)" if gpus.get((p.namespace, p.name)) else "")
        for p in selection.to_evict
    ]
    shown = ", ".join(names[:5]) + (f", ... ({len(names) - 5} more)" if len(names) > 5 else "")
    if selection.refused:
        blocked = len(selection.blocking)
        return f"would refuse: {blocked} pod(s) block the drain (see the warning)", [
            selection.refusal_message()
        ]
    if not names:
        return "nothing to evict now (checked again at apply time)", []
    return f"evict {len(names)} pod(s) through the Eviction API: {shown}", []

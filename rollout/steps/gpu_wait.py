"""gpu.wait: wait until the node advertises its GPUs again, GPUs x replicas.

What the node must advertise is one rule (`expect_gpus`), read by gpu.wait's plan and
apply and by gpu.smoke: the physical GPUs from the facts times the replicas of the spec's
time-slicing profile (else the node's own gpu.replicas label), under the resource name
renameByDefault picks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from rollout.facts import NodeFacts
from rollout.facts.gpu_operator import current_replicas, physical_gpus
from rollout.facts.pods import GPU_RESOURCE, SHARED_GPU_RESOURCE
from rollout.plan import StepPlan
from rollout.spec import Spec
from rollout.steps.base import StepContext, StepFailed, StepResult
from rollout.steps.deadline import POLL_INTERVAL_S, Deadline
from rollout.steps.deviceplugin import DEVICE_PLUGIN_SELECTOR, find_device_plugin_pods
from rollout.steps.nodechanges import Reach, ReachingStep
from rollout.steps.nodemarks import MarkingStep
from rollout.steps.pods import describe_pod
from rollout.steps.profile_changes import time_slicing_change
from rollout.transports.kube import Node, Pod
from rollout.wholenumber import whole_number


@dataclass(frozen=True)
class GpuExpectation:
    """What the node must advertise: `count` of `resource` (0: the node has no GPUs)."""

    resource: str
    count: int
    physical: int
    replicas: int

    def describe(self) -> str:
        if self.replicas == 1:
            return f"{self.resource} = {self.count}"
        return f"{self.resource} = {self.count} ({self.physical} GPUs x {self.replicas} replicas)"


def expect_gpus(spec: Spec, facts: NodeFacts) -> GpuExpectation:
    """Physical GPUs (facts) x replicas: the spec's time-slicing change, else the node's label.

    The resource name follows renameByDefault, which moves shared GPUs to
    nvidia.com/gpu.shared. Both gpu.wait's plan and its apply read this one rule.
    """
    change = time_slicing_change(spec)
    if change is not None:
        replicas = change.replicas_for(GPU_RESOURCE)
        renamed = change.rename_by_default and replicas > 1
    else:
        replicas, renamed = current_replicas(facts), False
    # a resumed run's facts may come from a node whose driver upgrade is half done
    physical = physical_gpus(facts)
    return GpuExpectation(
        resource=SHARED_GPU_RESOURCE if renamed else GPU_RESOURCE,
        count=physical * replicas,
        physical=physical,
        replicas=replicas,
    )


def advertised_count(values: Mapping[str, str], resource: str) -> int | None:
    """A node's capacity or allocatable of `resource` as an integer; None when absent."""
    text = values.get(resource)
    return whole_number(text) if text is not None else None


def gpus_match(node: Node, expected: GpuExpectation) -> bool:
    """Allocatable and capacity both at the expected count (absent counts as 0)."""
    allocatable = advertised_count(node.allocatable, expected.resource) or 0
    capacity = advertised_count(node.capacity, expected.resource) or 0
    return allocatable == expected.count and capacity == expected.count


@dataclass(frozen=True)
class GpuWaitStep(ReachingStep, MarkingStep):
    """Wait until the node advertises its GPUs again: allocatable = GPUs x replicas."""

    kind: ClassVar[str] = "gpu.wait"
    reach: ClassVar[Reach] = Reach.NODE

    def plan_change(self, facts: NodeFacts, spec: Spec) -> StepPlan:
        expected = expect_gpus(spec, facts)
        return StepPlan.acting(
            self.kind, f"wait for allocatable {expected.resource} = {expected.count}"
        )

    def _apply(self, ctx: StepContext) -> StepResult:
        expected = expect_gpus(ctx.spec, ctx.facts)
        deadline = Deadline(ctx.spec.policy.verify.gpu_wait_timeout_s, ctx.sleep)
        follow_label = time_slicing_change(ctx.spec) is None
        while True:
            node = ctx.kube.get_node(ctx.node)
            if follow_label:
                # Without a profile of its own the plan keeps the one the node loads, which
                # GFD's gpu.replicas label tells once the plugin runs: a plugin that could not
                # start before (a lost handler) loads its profile only now.
                expected = expect_gpus(ctx.spec, replace(ctx.facts, labels=node.labels))
            # Allocatable alone can still show the old count for a moment after a restart,
            # before the kubelet notices the plugin went away; a plugin pod that is not
            # ready means it has not (re)registered yet.
            plugins = find_device_plugin_pods(ctx) if expected.count else []
            plugins_ready = all(p.ready and not p.deleting for p in plugins)
            if gpus_match(node, expected) and plugins_ready:
                if expected.count == 0:
                    return StepResult.done("the node has no GPUs (facts) and advertises none")
                return StepResult.done(
                    f"allocatable {expected.describe()} after {round(deadline.elapsed_s)}s"
                )
            if deadline.expired:
                raise StepFailed(
                    ctx.node,
                    self.kind,
                    describe_gpu_shortfall(node, expected, plugins, deadline.elapsed_s),
                )
            deadline.sleep(POLL_INTERVAL_S)

    def undo(self, ctx: StepContext) -> None:
        """A check changes nothing."""


def describe_gpu_shortfall(
    node: Node, expected: GpuExpectation, plugins: Sequence[Pod], waited_s: float
) -> str:
    """Why the wait failed: capacity vs allocatable, and the device plugin's own state."""
    allocatable = advertised_count(node.allocatable, expected.resource)
    capacity = advertised_count(node.capacity, expected.resource)
    lines = [
        f"expected {expected.describe()} within {round(waited_s)}s; the node reports "
        f"capacity {_count_text(capacity)}, allocatable {_count_text(allocatable)}"
    ]
    if capacity and not allocatable:
        lines.append(
            "capacity without allocatable: the kubelet lost the device plugin (devices "
            "unhealthy); check the plugin pod and containerd's `nvidia` runtime handler"
        )
    elif capacity is None and expected.count:
        lines.append("no GPU resource at all: the device plugin never registered on this node")
    elif capacity is not None and capacity != expected.count:
        lines.append(
            "the device plugin advertises another count: check the node's "
            "nvidia.com/device-plugin.config label and the profile it selects"
        )
    if plugins:
        lines.extend(f"device plugin {describe_pod(p)}" for p in plugins)
    else:
        lines.append(f"no device-plugin pod ({DEVICE_PLUGIN_SELECTOR}) on the node")
    return "\n  ".join(lines)


def _count_text(count: int | None) -> str:
    return "absent" if count is None else str(count)

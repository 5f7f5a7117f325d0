"""gpu.wait: wait until the node advertises its GPUs again, GPUs x replicas.

What the node must advertise is one rule (`expect_gpus`), read by gpu.wait's plan and
apply and by gpu.smoke: the physical GPUs from the facts times the replicas of the spec's
time-slicing profile (else the node's own gpu.replicas label), under the resource name
renameByDefault picks.

Then the GPU Operator's own signal that the node's GPU stack works end to end: where the
node's deploy label schedules the validator (`nvidia.com/gpu.deploy.operator-validator=true`),
its pod `app=nvidia-operator-validator` on the node is Ready. Its init containers validate the
driver, the toolkit (whose injected files or CDI spec name the driver's libraries), a CUDA
workload and the plugin, in that order, and rerun whenever the pod restarts: after a driver
change or a reboot the device plugin can advertise GPUs before the toolkit has caught up with
the new driver, and a smoke pod started in that window would see the old one (FACTS.md, the
validator). The operator's own upgrade controller waits for the same signal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from rollout.changes.base import PlanningContext
from rollout.facts import NodeFacts
from rollout.facts.gpu_operator import VALIDATOR_APP, current_replicas, physical_gpus
from rollout.facts.migmode import MigMode, read_mig_mode
from rollout.facts.pods import GPU_RESOURCE, SHARED_GPU_RESOURCE, advertised_now, gpu_counts
from rollout.inputs.wholenumber import whole_number
from rollout.operatornames import DEPLOY_LABEL_PREFIX
from rollout.plan import NodePlan, ResourceForecast, StepPlan
from rollout.rbac import grants_of
from rollout.spec import Spec
from rollout.steps.base import StepContext, StepFailed, StepResult
from rollout.steps.deadline import POLL_INTERVAL_S
from rollout.steps.nodechanges import Reach, ReachingStep
from rollout.steps.nodemarks import MarkingStep
from rollout.steps.pods import DEVICE_PLUGIN_SELECTOR, describe_pod, find_device_plugin_pods
from rollout.steps.traits import StepTraits
from rollout.transports.kube import Node, Pod

VALIDATOR_SELECTOR = f"app={VALIDATOR_APP}"
VALIDATOR_DEPLOY_LABEL = DEPLOY_LABEL_PREFIX + "operator-validator"


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
    """Physical GPUs (facts) x replicas: the spec's GPU sharing (time-slicing), else the
    node's label.

    The resource name follows renameByDefault, which moves shared GPUs to
    nvidia.com/gpu.shared: the profile's one rule (TimeSlicingChange.shared_gpus), which
    gpu.wait's plan and apply and the plan's capacity forecast read.
    """
    shared = spec.shared_gpus()
    if shared is not None:
        resource, replicas = shared
    else:
        resource, replicas = advertised_gpu_resource(facts), current_replicas(facts)
    # a resumed run's facts may come from a node whose driver upgrade is half done
    physical = physical_gpus(facts)
    return GpuExpectation(
        resource=resource,
        count=physical * replicas,
        physical=physical,
        replicas=replicas,
    )


def forecast_expectations(
    node_plan: NodePlan,
    facts: NodeFacts,
    expected: GpuExpectation,
    *,
    rolled_back: bool = False,
) -> tuple[GpuExpectation, ...] | None:
    """What the plan's capacity forecast says the node advertises after (before, once
    `rolled_back`), each resource above 0, where the forecast moves a resource that
    `expected` (expect_gpus' one rule) does not cover (a MIG layout's devices), or where the
    node is in MIG mode (`facts`), whoever put it there; None where that rule says it all. A
    resource at 0 is not waited for: the kubelet keeps a gone resource's capacity for minutes
    (FACTS.md, kubelet device manager)."""
    mode = read_mig_mode(facts.labels, facts.allocatable)
    return promised_by(node_plan.capacity.resources, expected, rolled_back, mode)


def planned_expectations(
    ctx: PlanningContext, facts: NodeFacts, forecast: Sequence[ResourceForecast] | None = None
) -> tuple[GpuExpectation, ...] | None:
    """forecast_expectations while the plan is made: the forecast the plan will show for the
    node (`forecast`, where the caller has it: planned_forecast)."""
    mode = read_mig_mode(facts.labels, facts.allocatable)
    resources = planned_forecast(ctx, facts) if forecast is None else forecast
    return promised_by(resources, expect_gpus(ctx.spec, facts), False, mode)


def planned_forecast(ctx: PlanningContext, facts: NodeFacts) -> list[ResourceForecast]:
    """The node's GPU resources before -> after, as the plan's forecast will show them."""
    before = gpu_counts(facts.allocatable)
    after = ctx.advertised(facts).counts
    return [
        ResourceForecast(name, before.get(name, 0), after.get(name, 0))
        for name in sorted({*before, *after})
    ]


def kept_mig_mode(facts: NodeFacts, resources: Sequence[ResourceForecast]) -> MigMode:
    """The node's MIG mode (its facts) where the plan leaves its devices as they are; OFF
    where the plan moves them, since the labels read before a layout change say nothing of
    after (a step that runs after it reads the node then)."""
    if any(r.after != r.before for r in resources):
        return MigMode.OFF
    return read_mig_mode(facts.labels, facts.allocatable)


def promised_by(
    resources: Sequence[ResourceForecast],
    expected: GpuExpectation,
    rolled_back: bool,
    mode: MigMode = MigMode.OFF,
) -> tuple[GpuExpectation, ...] | None:
    moved = {r.resource: r.after for r in resources if r.after and r.after != r.before}
    if not moved and mode is not MigMode.OFF:
        # MIG devices the plan leaves as they are: not GPUs x replicas (under the single
        # strategy nvidia.com/gpu counts MIG devices), but what the node advertises now
        moved = {r.resource: r.after for r in resources if r.after}
    if not moved or moved == {expected.resource: expected.count}:
        return None
    counts = {r.resource: r.before if rolled_back else r.after for r in resources}
    return tuple(
        GpuExpectation(name, count, expected.physical, 1) for name, count in counts.items() if count
    )


def describe_wait(expectations: Sequence[GpuExpectation], facts: NodeFacts) -> str:
    """gpu.wait's action in the plan: the counts it waits for, then the validator."""
    counts = ", ".join(f"{e.resource} = {e.count}" for e in expectations)
    action = f"wait for allocatable {counts}"
    if any(e.count for e in expectations) and facts.labels.get(VALIDATOR_DEPLOY_LABEL) == "true":
        action += f", then the GPU Operator's validator ({VALIDATOR_SELECTOR}) Ready"
    return action


def advertised_gpu_resource(facts: NodeFacts) -> str:
    """The name the node advertises its GPUs under now: nvidia.com/gpu.shared where the
    profile it runs renames shared GPUs (renameByDefault), else nvidia.com/gpu. A plan without
    a profile of its own keeps the node's, name included. A shared name none of which is
    allocatable is one the plugin stopped advertising (rollout.facts.pods.advertised_now)."""
    shared = advertised_now(facts.capacity, facts.allocatable).get(SHARED_GPU_RESOURCE, 0)
    return SHARED_GPU_RESOURCE if shared else GPU_RESOURCE


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
    # the device plugin registers again and the kubelet advertises the GPUs
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=False,
        grants=grants_of("", "nodes", "get"),
        expected_s=15.0,
        worst_s=lambda policy: float(policy.verify.gpu_wait_timeout_s),
    )
    reach: ClassVar[Reach] = Reach.NODE

    def plan(self, ctx: PlanningContext, facts: NodeFacts) -> StepPlan:
        planned = super().plan(ctx, facts)
        promised = planned_expectations(ctx, facts) if planned.changes else None
        if promised is None:
            return planned
        return StepPlan.acting(self.kind, describe_wait(promised, facts))

    def plan_change(self, facts: NodeFacts, spec: Spec) -> StepPlan:
        return StepPlan.acting(self.kind, describe_wait((expect_gpus(spec, facts),), facts))

    def _apply(self, ctx: StepContext) -> StepResult:
        expected = expect_gpus(ctx.spec, ctx.facts)
        forecast = forecast_expectations(ctx.node_plan, ctx.facts, expected)
        deadline = ctx.deadline(ctx.spec.policy.verify.gpu_wait_timeout_s)
        follow_label = ctx.spec.shared_gpus() is None and forecast is None
        advertised_s: float | None = None
        announced = False
        while True:
            node = ctx.kube.get_node(ctx.node)
            if follow_label:
                # Without a profile of its own the plan keeps the one the node loads, which
                # GFD's gpu.replicas label tells once the plugin runs: a plugin that could not
                # start before (a lost handler) loads its profile only now.
                live = replace(ctx.facts, labels=node.labels, capacity=node.capacity)
                expected = expect_gpus(ctx.spec, live)
            expectations = forecast or (expected,)
            unmet = [e for e in expectations if not gpus_match(node, e)]
            count = sum(e.count for e in expectations)
            # Allocatable alone can still show the old count for a moment after a restart,
            # before the kubelet notices the plugin went away; a plugin pod that is not
            # ready means it has not (re)registered yet.
            plugins = find_device_plugin_pods(ctx) if count else []
            plugins_ready = all(p.ready and not p.deleting for p in plugins)
            advertised = not unmet and plugins_ready
            if advertised and count == 0:
                return StepResult.done("the node has no GPUs (facts) and advertises none")
            if advertised and advertised_s is None:
                advertised_s = deadline.elapsed_s
            validators = find_validator_pods(ctx) if wants_validator(node) else None
            if advertised and advertised_s is not None and validator_ready(validators):
                described = ", ".join(e.describe() for e in expectations)
                done = f"allocatable {described} after {round(advertised_s)}s"
                return StepResult.done(
                    done + describe_validator_wait(validators, deadline.elapsed_s - advertised_s)
                )
            if deadline.expired:
                short = unmet[0] if unmet else expectations[0]
                problem = describe_gpu_shortfall(node, short, plugins, deadline.elapsed_s)
                if advertised:
                    problem = describe_validator_shortfall(validators, deadline.elapsed_s)
                raise StepFailed(ctx.node, self.kind, problem)
            if advertised and not announced:
                announced = True
                ctx.progress(
                    f"{ctx.node}: {self.kind}: GPUs advertised; waiting for the GPU Operator's "
                    f"validator ({VALIDATOR_SELECTOR}) to be Ready on the node"
                )
            deadline.sleep(POLL_INTERVAL_S)

    def undo(self, ctx: StepContext) -> None:
        """A check changes nothing."""


def wants_validator(node: Node) -> bool:
    """The operator schedules its validator on the node (its deploy label is `true`)."""
    return node.labels.get(VALIDATOR_DEPLOY_LABEL) == "true"


def find_validator_pods(ctx: StepContext) -> list[Pod]:
    """The GPU Operator's validator pods bound to the node, in any namespace."""
    return ctx.kube.list_pods(
        None, label_selector=VALIDATOR_SELECTOR, field_selector=f"spec.nodeName={ctx.node}"
    )


def validator_ready(validators: Sequence[Pod] | None) -> bool:
    """None: no validator to wait for; else one of the node's validator pods is Ready."""
    return validators is None or any(p.ready and not p.deleting for p in validators)


def describe_validator_wait(validators: Sequence[Pod] | None, waited_s: float) -> str:
    if validators is None:
        return ""
    ready = next(p for p in validators if p.ready and not p.deleting)
    more = f" {round(waited_s)}s later" if round(waited_s) else ""
    return f"; the GPU Operator's validator {ready.namespace}/{ready.name} Ready{more}"


def describe_validator_shortfall(validators: Sequence[Pod] | None, waited_s: float) -> str:
    """The GPUs are advertised, but the operator's validator never became Ready."""
    lines = [
        f"the node advertises its GPUs, but the GPU Operator's validator ({VALIDATOR_SELECTOR}) "
        f"was not Ready within {round(waited_s)}s: its driver, toolkit, CUDA or plugin "
        "validation has not passed since the change; check that pod's init containers"
    ]
    if validators:
        lines.extend(f"validator {describe_pod(p)}" for p in validators)
    else:
        lines.append(
            f"no validator pod on the node, though {VALIDATOR_DEPLOY_LABEL}=true schedules one"
        )
    return "\n  ".join(lines)


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

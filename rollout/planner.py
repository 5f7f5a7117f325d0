"""The planner: spec x facts x playbooks -> Plan: targets, waves and step order only.

Pure: it reads facts, it never probes. What each step does (or why it is a no-op) is the
step's own decision (`Step.plan`), so a plan of an already-converged fleet says so node by
node, and `rollout apply` asks the very same code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rollout.capacity import forecast_fleet, forecast_node
from rollout.errors import BadInput
from rollout.facts import ClusterFacts, FleetFacts, NodeFacts
from rollout.facts.gpu_operator import physical_gpus
from rollout.limit import LimitError, NodeLimit
from rollout.plan import NodePlan, Plan, StepPlan
from rollout.playbook import Playbook, PlaybookStep, compose_steps
from rollout.spec import (
    ContainerdChange,
    DriverMode,
    DriverUpgradeChange,
    RegistryChange,
    Spec,
    TimeSlicingChange,
)
from rollout.steps import step_planners
from rollout.steps.base import StepPlanner
from rollout.steps.containerd_changes import CONTAINERD_PLANS
from rollout.steps.driver import driver_change
from rollout.steps.driver_operator_plan import plan_operator_upgrade
from rollout.steps.nodechanges import node_changes
from rollout.steps.profile_changes import SHARED_MEMORY_WARNING, plan_cluster_changes
from rollout.topology import build_waves, check_changed_together, find_groups

# Distinct node configurations planned at once (each mostly waits for `containerd config dump`).
ENGINE_RUNS_AT_ONCE = 4


class TargetError(BadInput):
    """The plan targets nothing, or names a node the facts do not know."""


def build_plan(
    spec: Spec,
    spec_source: str,
    fleet: FleetFacts,
    playbooks: Mapping[str, Playbook],
    limit: NodeLimit | None = None,
) -> Plan:
    """Plan every change of the spec over the targeted nodes of the fleet (within `limit`)."""
    targets = select_targets(spec, fleet)
    limited_out: list[str] = []
    if limit is not None:
        limit.check_names((n.name for n in fleet.nodes), fleet.source)
        limited_out = [n.name for n in targets if not limit.admits(n.name, n.labels)]
        targets = [n for n in targets if limit.admits(n.name, n.labels)]
        if not targets:
            raise LimitError(
                f"--limit {limit.text} leaves none of the plan's {len(limited_out)} target "
                f"node(s): {', '.join(limited_out[:20])}"
            )
    kinds = change_kinds(spec)
    steps = compose_steps(playbooks[kind] for kind in kinds)
    planners = step_planners()
    cluster_changes = plan_cluster_changes(spec, fleet.cluster)
    CONTAINERD_PLANS.plan_distinct(spec, targets, ENGINE_RUNS_AT_ONCE)
    groups = find_groups(spec, [(n.name, n.labels) for n in targets])
    node_plans = [plan_node(spec, node, fleet.cluster, steps, planners) for node in targets]
    waves = build_waves(spec, node_plans, groups)
    warnings: list[str] = []
    if any(isinstance(c, TimeSlicingChange) and c.config.sharing for c in spec.changes):
        warnings.append(SHARED_MEMORY_WARNING)
    # mode: operator: pin, version and upgradePolicy (rollout.steps.driver_operator_plan)
    budget = spec.policy.max_unavailable_count(len(fleet.nodes))
    check_changed_together(spec, kinds, waves, budget)
    operator = plan_operator_upgrade(spec, fleet, targets, budget)
    if operator is not None:
        cluster_changes = [*cluster_changes, *operator.to_cluster_changes()]
        warnings.extend(operator.warnings())
    # a target --limit left out is said as such (Plan.limited_out), not as untargeted
    targeted = {n.name for n in targets}.union(limited_out)
    return Plan(
        name=spec.metadata.name,
        source=spec_source,
        facts_source=fleet.source,
        changes=tuple(kinds),
        waves=waves,
        cluster_changes=tuple(cluster_changes),
        max_unavailable=budget,
        already_unavailable=tuple(n.name for n in fleet.nodes if not n.available),
        not_targeted=tuple(n.name for n in fleet.nodes if n.name not in targeted),
        warnings=tuple(warnings),
        limit=limit.text if limit is not None else "",
        limited_out=tuple(limited_out),
        capacity=forecast_fleet(node_plans),
    )


def change_kinds(spec: Spec) -> list[str]:
    """The playbook kinds the spec's changes need, in the order the changes are written."""
    kinds: list[str] = []
    for change in spec.changes:
        kind = (
            "containerd"
            if isinstance(change, RegistryChange | ContainerdChange)
            else "time-slicing"
            if isinstance(change, TimeSlicingChange)
            else "driver-operator"
            if isinstance(change, DriverUpgradeChange) and change.mode is DriverMode.OPERATOR
            else "driver-upgrade"
        )
        if kind not in kinds:
            kinds.append(kind)
    return kinds


def select_targets(spec: Spec, fleet: FleetFacts) -> list[NodeFacts]:
    """The nodes the spec targets, by name and/or label selector, in name order."""
    known = {n.name for n in fleet.nodes}
    missing = [name for name in spec.targets.nodes if name not in known]
    if missing:
        raise TargetError(
            f"{spec.location_of('targets', 'nodes')}: targets.nodes names "
            f"{', '.join(missing)}, not found in {fleet.source}; "
            f"known nodes: {', '.join(sorted(known))}"
        )
    chosen = [n for n in fleet.nodes if spec.targets.includes(n.name, n.labels)]
    if not chosen:
        selector = spec.targets.selector.to_string() if spec.targets.selector else "none"
        raise TargetError(
            f"{spec.location_of('targets')}: the plan's targets match no node in "
            f"{fleet.source} (selector {selector!r}, nodes {list(spec.targets.nodes) or 'any'})"
        )
    return sorted(chosen, key=lambda n: n.name)


def plan_node(
    spec: Spec,
    node: NodeFacts,
    cluster: ClusterFacts,
    steps: Sequence[PlaybookStep],
    planners: Mapping[str, StepPlanner],
) -> NodePlan:
    """One node's steps, each planned by the step itself, and what the node looks like now."""
    changes = node_changes(node, cluster, spec)
    planned: list[StepPlan] = []
    for step in steps:
        decided = planners[step.kind].plan(node, cluster, spec)
        planned.append(decided.with_step(step.kind, step.why))
    work = changes.containerd
    warnings = list(work.notes) + [w for p in planned for w in p.warnings]
    label = changes.profile.label
    return NodePlan(
        name=node.name,
        containerd_version=str(node.containerd),
        steps=tuple(planned),
        files=work.files,
        effective_changes=work.effective_changes,
        effective_diff=work.effective_diff,
        defaults_source=work.defaults_source,
        shadowing=work.shadowing,
        repairs=work.repairs,
        labels=(label,) if label is not None else (),
        warnings=tuple(warnings),
        status=describe_status(node),
        unavailable=not node.available,
        driver=driver_change(spec, node),
        gpus=physical_gpus(node),
        capacity=forecast_node(spec, node),
    )


def describe_status(node: NodeFacts) -> str:
    """The node as probed: containerd's service state, GPUs, taints (live facts only)."""
    parts: list[str] = []
    if node.service is not None:
        restarts = "?" if node.service.n_restarts is None else node.service.n_restarts
        parts.append(
            f"containerd {node.service.active_state} "
            f"(MainPID {node.service.main_pid}, {restarts} restart(s))"
        )
    if node.capacity:
        parts.append(
            f"nvidia.com/gpu {node.allocatable.get('nvidia.com/gpu', '0')}/"
            f"{node.capacity.get('nvidia.com/gpu', '0')} allocatable"
        )
    if node.taints:
        parts.append("taints " + ", ".join(node.taints))
    return "; ".join(parts)

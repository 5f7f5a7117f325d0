"""The planner: spec x facts x playbooks -> Plan: targets, waves and step order only.

Pure: it reads facts, it never probes. What each step does (or why it is a no-op) is the
step's own decision (`Step.plan`), so a plan of an already-converged fleet says so node by
node, and `rollout apply` asks the very same code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rollout.capacity import forecast_fleet, forecast_node
from rollout.changes import kind_planners
from rollout.changes.base import ChangeKindPlanner, PlanningContext, kind_of
from rollout.errors import BadInput
from rollout.facts import FleetFacts, NodeFacts
from rollout.facts.gpu_operator import physical_gpus
from rollout.limit import LimitError, NodeLimit
from rollout.plan import NodePlan, Plan, StepPlan
from rollout.playbook import Playbook, PlaybookStep, compose_steps
from rollout.spec import Spec
from rollout.steps import step_planners
from rollout.steps.base import StepPlanner
from rollout.topology import build_waves, check_changed_together, find_groups


class TargetError(BadInput):
    """The plan targets nothing, or names a node the facts do not know."""


def build_plan(
    spec: Spec,
    spec_source: str,
    fleet: FleetFacts,
    playbooks: Mapping[str, Playbook],
    limit: NodeLimit | None = None,
    kinds: Mapping[str, ChangeKindPlanner] | None = None,
) -> Plan:
    """Plan every change of the spec over the targeted nodes of the fleet (within `limit`);
    each change is planned by its kind (`kinds`: the registered ones, rollout.changes)."""
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
    budget = spec.policy.max_unavailable_count(len(fleet.nodes))
    ctx = PlanningContext(spec, fleet, kinds, targets, budget)
    playbook_names = change_kinds(spec, ctx.kinds)
    steps = compose_steps(playbooks[name] for name in playbook_names)
    planners = step_planners()
    for _, kind, change in ctx.planned_kinds():
        kind.prepare(ctx, change)
    cluster_work = ctx.cluster_work()
    groups = find_groups(spec, [(n.name, n.labels) for n in targets])
    node_plans = [plan_node(ctx, node, steps, planners) for node in targets]
    waves = build_waves(spec, node_plans, groups)
    check_changed_together(spec, playbook_names, waves, budget)
    # a target --limit left out is said as such (Plan.limited_out), not as untargeted
    targeted = {n.name for n in targets}.union(limited_out)
    return Plan(
        name=spec.metadata.name,
        source=spec_source,
        facts_source=fleet.source,
        changes=tuple(playbook_names),
        waves=waves,
        cluster_changes=tuple(c for work in cluster_work for c in work.changes),
        max_unavailable=budget,
        already_unavailable=tuple(n.name for n in fleet.nodes if not n.available),
        not_targeted=tuple(n.name for n in fleet.nodes if n.name not in targeted),
        warnings=tuple(w for work in cluster_work for w in work.warnings),
        limit=limit.text if limit is not None else "",
        limited_out=tuple(limited_out),
        capacity=forecast_fleet(node_plans),
    )


def change_kinds(spec: Spec, kinds: Mapping[str, ChangeKindPlanner] | None = None) -> list[str]:
    """The playbooks the spec's changes need, in the order the changes are written."""
    known = kinds if kinds is not None else kind_planners()
    found: list[str] = []
    for change in spec.changes:
        name = kind_of(known, change).playbook(change)
        if name not in found:
            found.append(name)
    return found


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
    ctx: PlanningContext,
    node: NodeFacts,
    steps: Sequence[PlaybookStep],
    planners: Mapping[str, StepPlanner],
) -> NodePlan:
    """One node's steps, each planned by the step itself, and what the node looks like now."""
    work = ctx.all_work(node)
    planned: list[StepPlan] = []
    for step in steps:
        decided = planners[step.kind].plan(ctx, node)
        planned.append(decided.with_step(step.kind, step.why))
    warnings = [n for w in work for n in w.notes] + [w for p in planned for w in p.warnings]
    node_plan = NodePlan(
        name=node.name,
        containerd_version=str(node.containerd),
        steps=tuple(planned),
        labels=tuple(label for w in work for label in w.labels),
        warnings=tuple(warnings),
        status=describe_status(node),
        unavailable=not node.available,
        gpus=physical_gpus(node),
        capacity=forecast_node(ctx.spec, node, ctx),
    )
    for each in work:
        node_plan = each.add_to(node_plan)
    return node_plan


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

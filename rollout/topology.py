"""Topology groups: targets sharing a label value (an NVLink clique, a rack, a zone), and
waves built from whole groups so that no group is ever split across waves (invariant 11).

A wave takes whole groups, in the order of their first node's name, while the next group
still fits its size (policy.waves); a wave holds more than its size only when its one group
alone is larger. Without `group_by` every node is a group of its own, which gives exactly the
plain waves of policy.waves.

Some changes must reach a group's nodes together: a driver change (host or operator) puts a
second driver version into an NVLink domain while part of it is changed, so with `group_by`
the plan is refused when max_unavailable (or max_unavailable_per_group) cannot take one
whole group down at once. Containerd, registry and time-slicing changes work node by node
and carry no such need.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rollout.budget import GroupLimit
from rollout.errors import BadInput
from rollout.plan import NodePlan, Plan, TopologyGroup, Wave
from rollout.spec import Spec
from rollout.spec.policy import Policy, Ungrouped
from rollout.steps import step_traits
from rollout.steps.traits import takes_down

# Change kinds (playbooks) whose nodes of one group must be changed together
CHANGED_TOGETHER = frozenset({"driver-upgrade", "driver-operator"})


class TopologyError(BadInput):
    """The plan's topology groups cannot be planned: ungrouped nodes refused, or a group
    that must change together is larger than the budget."""


def find_groups(
    spec: Spec, targets: Sequence[tuple[str, Mapping[str, str]]]
) -> list[TopologyGroup]:
    """The targets (name, labels) as topology groups, ordered by their first node's name."""
    policy = spec.policy
    key = policy.group_by
    if key is None:
        return [TopologyGroup(label="", nodes=(name,)) for name, _ in targets]
    missing = [name for name, labels in targets if key not in labels]
    if missing and policy.ungrouped is Ungrouped.REFUSE:
        shown = ", ".join(missing[:20]) + (
            f" and {len(missing) - 20} more" if len(missing) > 20 else ""
        )
        raise TopologyError(
            f"{spec.location_of('policy', 'ungrouped')}: {len(missing)} target node(s) have no "
            f"{key} label and policy.ungrouped is refuse: {shown}; label them, leave them out "
            "of targets, or set ungrouped: alone"
        )
    members: dict[str, list[str]] = {}
    for name, labels in targets:
        label = f"{key}={labels[key]}" if key in labels else ""
        # a node name holds no "=": a node without the label is keyed by its name, alone
        members.setdefault(label or name, []).append(name)
    groups = []
    for label, names in members.items():
        ordered = tuple(sorted(names))
        limit = policy.max_unavailable_per_group
        groups.append(
            TopologyGroup(
                label=label if "=" in label else "",
                nodes=ordered,
                max_unavailable=0 if limit is None else limit.resolve_down(len(ordered)),
            )
        )
    return sorted(groups, key=lambda g: g.nodes[0])


def pack_waves(
    policy: Policy, groups: Sequence[TopologyGroup]
) -> list[tuple[int, tuple[TopologyGroup, ...]]]:
    """Whole groups per wave, each with the size policy.waves asked for it."""
    total = sum(len(g.nodes) for g in groups)
    waves: list[tuple[int, tuple[TopologyGroup, ...]]] = []
    queue = list(groups)
    queue.reverse()
    while queue:
        size = policy.waves[min(len(waves), len(policy.waves) - 1)].resolve_up(total)
        taken = [queue.pop()]
        count = len(taken[0].nodes)
        while queue and count + len(queue[-1].nodes) <= size:
            count += len(queue[-1].nodes)
            taken.append(queue.pop())
        waves.append((size, tuple(taken)))
    return waves


def build_waves(
    spec: Spec, node_plans: Sequence[NodePlan], groups: Sequence[TopologyGroup]
) -> tuple[Wave, ...]:
    """The plan's waves of whole groups; each wave records its groups when the plan groups."""
    by_name = {node.name: node for node in node_plans}
    recorded = spec.policy.group_by is not None
    return tuple(
        Wave(
            index=index,
            nodes=tuple(by_name[name] for group in taken for name in group.nodes),
            groups=taken if recorded else (),
            size=size if recorded else 0,
        )
        for index, (size, taken) in enumerate(pack_waves(spec.policy, groups), start=1)
    )


def check_changed_together(
    spec: Spec, kinds: Sequence[str], waves: Sequence[Wave], max_unavailable: int
) -> None:
    """Refuse a plan whose budget cannot take one whole group down when the change must
    reach a group's nodes together (CHANGED_TOGETHER)."""
    together = sorted(CHANGED_TOGETHER.intersection(kinds))
    if spec.policy.group_by is None or not together:
        return
    traits = step_traits()
    for wave in waves:
        down = {node.name for node in wave.nodes if takes_down(node, traits)}
        for group in wave.groups:
            size = sum(1 for name in group.nodes if name in down)
            limits = [("max_unavailable", max_unavailable)]
            if group.max_unavailable:
                limits.append(("max_unavailable_per_group", group.max_unavailable))
            for field, limit in limits:
                if size > limit:
                    raise TopologyError(
                        f"{spec.location_of('policy', field)}: {field} {limit} cannot take "
                        f"group {group.label} ({size} node(s) to change: "
                        f"{', '.join(group.nodes)}) down whole, and a {together[0]} change "
                        "must reach a group's nodes together (two driver versions in one "
                        f"NVLink domain); raise {field} to at least {size}"
                    )


def group_limits(plan: Plan) -> tuple[GroupLimit, ...]:
    """max_unavailable_per_group of the plan's groups, as the budget enforces it."""
    return tuple(
        GroupLimit(group.label, frozenset(group.nodes), group.max_unavailable)
        for wave in plan.waves
        for group in wave.groups
        if group.max_unavailable and group.label
    )

"""Node groups of a Plan: nodes whose plans are the same apart from their names, shown once.

A reviewer reads a fleet's plan by its distinct changes, not by its nodes: 10,000 nodes of
20 configurations are 20 diffs. Two nodes share a group when everything a reviewer sees of
them is the same (containerd version, steps, file changes, effective change, shadowing,
repairs, labels, warnings, status, driver change, GPUs) once each node's own name in that
text reads as `<node>`. Pure data: the render layer draws the groups.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from rollout.plan import NodePlan, Plan, StepPlan

# what a node's own name reads as in the text its group shows
NODE_PLACEHOLDER = "<node>"
# a drain (or another step) that would refuse says so in its action (rollout/steps/drain.py)
REFUSAL_PREFIX = "would refuse"


class GroupKind(Enum):
    """What a reviewer must see first: the order groups are shown in."""

    REFUSED = "refused"  # a step would refuse: the node cannot be changed as planned
    BROKEN = "broken"  # already broken: shadowed drop-ins, lost handlers, repairs
    WARNING = "warning"
    CHANGE = "change"
    NOOP = "no-op"


_ORDER = {kind: index for index, kind in enumerate(GroupKind)}


@dataclass(frozen=True)
class NodeGroup:
    """Nodes planned alike: `node` shows them all (its name and own-name mentions read
    `<node>` when the group has more than one node); `waves` counts the nodes per wave."""

    number: int
    kind: GroupKind
    node: NodePlan
    names: tuple[str, ...]
    waves: tuple[tuple[int, int], ...]

    @property
    def size(self) -> int:
        return len(self.names)


def classify_node(node: NodePlan) -> GroupKind:
    """Where a node's plan belongs in the order a reviewer reads."""
    if any(_refuses(step) for step in node.steps):
        return GroupKind.REFUSED
    if node.shadowing or node.repairs or any(not c.intended for c in node.effective_changes):
        return GroupKind.BROKEN
    if node.warnings or any(step.warnings for step in node.steps):
        return GroupKind.WARNING
    return GroupKind.CHANGE if node.changes else GroupKind.NOOP


def _refuses(step: StepPlan) -> bool:
    return (step.action or "").startswith(REFUSAL_PREFIX)


def group_nodes(plan: Plan) -> tuple[NodeGroup, ...]:
    """The plan's nodes in groups, numbered in the order shown: refusals and broken nodes,
    then warnings, then changes, then no-op nodes; within a kind, by the first node's wave
    and place in the plan."""
    keys = _KeyMaker()
    members: dict[Hashable, list[tuple[int, NodePlan]]] = {}
    for wave in plan.waves:
        for node in wave.nodes:
            members.setdefault(keys.key(node), []).append((wave.index, node))
    found = sorted(
        ((classify_node(m[0][1]), position, m) for position, m in enumerate(members.values())),
        key=lambda item: (_ORDER[item[0]], item[1]),
    )
    groups = []
    for number, (kind, _, nodes) in enumerate(found, start=1):
        per_wave: dict[int, int] = {}
        for index, _node in nodes:
            per_wave[index] = per_wave.get(index, 0) + 1
        first = nodes[0][1]
        shown = first if len(nodes) == 1 else _anonymous(first)
        groups.append(
            NodeGroup(
                number=number,
                kind=kind,
                node=shown,
                names=tuple(n.name for _, n in nodes),
                waves=tuple(per_wave.items()),
            )
        )
    return tuple(groups)


class _KeyMaker:
    """A node's grouping key: its fields but the name, own-name mentions as `<node>`.

    Copies of a node share their file and effective-change tuples (the planner's memo), so
    an unhashable part (an effective value that is a table) is turned into text once per
    object, kept alive here so that no id is reused meanwhile.
    """

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[object, Hashable]] = {}

    def key(self, node: NodePlan) -> Hashable:
        parts: list[Hashable] = []
        for f in dataclasses.fields(node):
            if f.name == "name":
                continue
            value = getattr(node, f.name)
            if f.name == "steps":
                parts.append(tuple(_anonymous_step(s, node.name) for s in value))
            elif f.name in ("warnings", "shadowing", "repairs"):
                parts.append(tuple(anonymise(text, node.name) for text in value))
            elif f.name == "status":
                parts.append(anonymise(value, node.name))
            else:
                parts.append(self._hashable(value))
        return tuple(parts)

    def _hashable(self, value: object) -> Hashable:
        try:
            hash(value)
        except TypeError:
            kept = self._by_id.get(id(value))
            if kept is None or kept[0] is not value:
                kept = self._by_id[id(value)] = (value, repr(value))
            return kept[1]
        return value


def anonymise(text: str, name: str) -> str:
    """`text` with the node's own name, where it stands as a word, read as `<node>`."""
    if not name or name not in text:
        return text
    return re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w-]|\.\w)", NODE_PLACEHOLDER, text)


def _anonymous_step(step: StepPlan, name: str) -> StepPlan:
    texts = (step.action or "", step.noop_reason or "", *step.warnings)
    if not any(name in text for text in texts):
        return step
    return dataclasses.replace(
        step,
        action=None if step.action is None else anonymise(step.action, name),
        noop_reason=None if step.noop_reason is None else anonymise(step.noop_reason, name),
        warnings=tuple(anonymise(w, name) for w in step.warnings),
    )


def _anonymous(node: NodePlan) -> NodePlan:
    """The node as its group shows it: `<node>` for its name wherever it is mentioned."""
    name = node.name
    return dataclasses.replace(
        node,
        name=NODE_PLACEHOLDER,
        steps=tuple(_anonymous_step(s, name) for s in node.steps),
        warnings=tuple(anonymise(w, name) for w in node.warnings),
        shadowing=tuple(anonymise(s, name) for s in node.shadowing),
        repairs=tuple(anonymise(r, name) for r in node.repairs),
        status=anonymise(node.status, name),
    )


_NUMBERED = re.compile(r"^(?P<prefix>.*?)(?P<digits>\d+)(?P<suffix>\D*)$")


def compress_names(names: Iterable[str]) -> list[str]:
    """Names as ranges where they number a series: gpu-a-001 ... gpu-a-050 and gpu-a-052 read
    `gpu-a-[001-050,052]`; a name without a number stays as it is. In first-seen order."""
    series: dict[tuple[str, str], list[str]] = {}
    order: list[tuple[str, str] | str] = []
    for name in names:
        found = _NUMBERED.match(name)
        if found is None:
            order.append(name)
            continue
        key = (found["prefix"], found["suffix"])
        if key not in series:
            series[key] = []
            order.append(key)
        series[key].append(found["digits"])
    shown = []
    for entry in order:
        if isinstance(entry, str):
            shown.append(entry)
            continue
        prefix, suffix = entry
        digits = series[entry]
        if len(digits) == 1:
            shown.append(f"{prefix}{digits[0]}{suffix}")
        else:
            shown.append(f"{prefix}[{','.join(_ranges(digits))}]{suffix}")
    return shown


def _ranges(digits: Sequence[str]) -> list[str]:
    """`001`, `002`, `003`, `007` -> `001-003`, `007`: consecutive numbers of one width."""
    ordered = sorted(set(digits), key=lambda d: (int(d), len(d)))
    out: list[str] = []
    start = end = ordered[0]
    for digit in ordered[1:]:
        if int(digit) == int(end) + 1 and _same_width(end, digit):
            end = digit
            continue
        out.append(start if start == end else f"{start}-{end}")
        start = end = digit
    out.append(start if start == end else f"{start}-{end}")
    return out


def _same_width(a: str, b: str) -> bool:
    # 009 -> 010 keeps a padded width; 9 -> 10 is an unpadded series
    padded = a.startswith("0") or b.startswith("0")
    return len(a) == len(b) if padded else True


def describe_names(names: Sequence[str], limit: int | None = None) -> str:
    """The names compressed; past `limit` characters, the first of them and "and N more"."""
    parts = compress_names(names)
    text = ", ".join(parts)
    if limit is None or len(text) <= limit:
        return text
    shown: list[str] = []
    used = 0
    for part in parts:
        if shown and used + len(part) + 2 > limit:
            break
        shown.append(part)
        used += len(part) + 2
    hidden = len(names) - sum(_count(part) for part in shown)
    return ", ".join(shown) + f" and {hidden} more"


def _count(part: str) -> int:
    """How many names one compressed part stands for."""
    found = re.search(r"\[([\d,-]+)\]\D*$", part)
    if found is None:
        return 1
    total = 0
    for piece in found.group(1).split(","):
        low, _, high = piece.partition("-")
        total += int(high or low) - int(low) + 1
    return total


@dataclass(frozen=True)
class WaveLoad:
    """What one wave takes out of service, and which groups its nodes are from."""

    index: int
    nodes: int
    taken_down: int
    gpus: int
    groups: tuple[tuple[int, int], ...]  # (group number, nodes of it in this wave)
    # the GPUs down at once at most: the largest max_unavailable nodes' GPUs together
    gpus_at_once: int = 0
    # with policy.group_by: the wave's topology groups (label or lone node, nodes), and the
    # size policy.waves asked for when one group alone made the wave larger (else 0)
    topology: tuple[tuple[str, int], ...] = ()
    oversized_from: int = 0


@dataclass(frozen=True)
class PlanSummary:
    """The plan's first lines: how many nodes change, which are untouched and why, and the
    GPUs each wave takes out of service."""

    nodes: int
    changing: int
    groups: int
    untouched: tuple[tuple[str, int], ...]  # (why, nodes)
    waves: tuple[WaveLoad, ...]


def summarise(plan: Plan, groups: Sequence[NodeGroup]) -> PlanSummary:
    """The summary of a plan whose nodes are in `groups` (group_nodes)."""
    # the steps (and the spec's pydantic) load with a plan, not with the renderers that import
    # this module: `rollout --help` or a mistyped command loads neither
    from rollout.steps import step_traits
    from rollout.steps.traits import takes_down

    number_of = {name: g.number for g in groups for name in g.names}
    traits = step_traits()
    waves = []
    for wave in plan.waves:
        counts: dict[int, int] = {}
        for node in wave.nodes:
            counts[number_of[node.name]] = counts.get(number_of[node.name], 0) + 1
        down = [n for n in wave.nodes if takes_down(n, traits)]
        largest = sorted((n.gpus for n in down), reverse=True)[: plan.max_unavailable]
        waves.append(
            WaveLoad(
                index=wave.index,
                nodes=len(wave.nodes),
                taken_down=len(down),
                gpus=sum(n.gpus for n in down),
                groups=tuple(sorted(counts.items())),
                gpus_at_once=sum(largest),
                topology=tuple(
                    (g.label or f"{g.nodes[0]} (unlabelled)", len(g.nodes)) for g in wave.groups
                ),
                oversized_from=wave.size if wave.oversized else 0,
            )
        )
    untouched: list[tuple[str, int]] = []
    # a node with nothing to change is untouched whatever its group: one matching the plan
    # but carrying a warning is shown among the warnings, and counted here too
    matching = [g for g in groups if not g.node.changes]
    if matching:
        flagged = sum(g.size for g in matching if g.kind is not GroupKind.NOOP)
        why = "already match the plan"
        if flagged:
            why += f", {flagged} of them with warnings shown above"
        untouched.append((why, sum(g.size for g in matching)))
    if plan.not_targeted:
        untouched.append(("not targeted by the plan", len(plan.not_targeted)))
    return PlanSummary(
        nodes=len(plan.nodes),
        changing=sum(g.size for g in groups if g.node.changes),
        groups=len(groups),
        untouched=tuple(untouched),
        waves=tuple(waves),
    )


def out_of_service(load: WaveLoad) -> str:
    """`24 GPU(s) on 6 node(s) out of service in turn, at most 8 at once`: what a wave takes
    away, said alike in the grouped and the full views."""
    text = f"{load.gpus} GPU(s) on {load.taken_down} node(s) out of service"
    if load.taken_down > 1 and load.gpus_at_once < load.gpus:
        text += f" in turn, at most {load.gpus_at_once} at once"
    return text


def wave_loads(plan: Plan) -> dict[int, WaveLoad]:
    """Each wave's load by its index, for the views that show every node (`--full`)."""
    return {load.index: load for load in summarise(plan, group_nodes(plan)).waves}


def describe_wave(load: WaveLoad) -> str:
    """`wave 2: 6 node(s) from group 1 (4), group 3 (2); 24 GPU(s) on 6 node(s) out of
    service in turn, at most 8 at once`, the groups as `groups` says them."""
    groups = ", ".join(f"group {number} ({count})" for number, count in load.groups)
    text = f"wave {load.index}: {load.nodes} node(s) from {groups}; {out_of_service(load)}"
    if load.topology:
        text += "; topology group(s) " + ", ".join(f"{g} ({n})" for g, n in load.topology)
    if load.oversized_from:
        text += f" (more than the wave's size {load.oversized_from}, to keep a group whole)"
    return text


def group_to_data(group: NodeGroup) -> dict[str, object]:
    """A group as JSON's `groups` lists it: number, kind, node names, nodes per wave."""
    return {
        "number": group.number,
        "kind": group.kind.value,
        "size": group.size,
        "nodes": list(group.names),
        "waves": [{"wave": index, "nodes": count} for index, count in group.waves],
    }

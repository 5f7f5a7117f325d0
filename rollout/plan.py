"""The Plan: waves of nodes, each node's steps with what they change or why they are no-ops.

A Plan is pure data. `rollout plan` renders it; `rollout apply` executes it. Every field a
reviewer sees in a plan is a field here, so the JSON output and the text output never drift.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.memo import ValueTable
from rollout.secrets import parse_path, redact_change, redact_diff, redact_toml_pair


@dataclass(frozen=True)
class FileChange:
    """One file write on a node: created (before None), replaced, or removed (after None)."""

    path: str
    before: str | None
    after: str | None
    reason: str

    @property
    def action(self) -> str:
        if self.before is None:
            return "create"
        if self.after is None:
            return "remove"
        return "modify"

    def unified_diff(self) -> str:
        """The change as a unified diff, for people: secrets show as changed, never their value."""
        return diff_file_texts(self.path, self.before, self.after)

    def redacted(self) -> FileChange:
        """This change as output shows it: every secret value replaced (rollout.secrets)."""
        before, after = redact_toml_pair(self.before, self.after)
        return dataclasses.replace(self, before=before, after=after)


# Copies of a node share their file texts: each distinct (path, before, after) is diffed once.
@functools.lru_cache(maxsize=4096)
def diff_file_texts(path: str, before: str | None, after: str | None) -> str:
    """A file change as a redacted unified diff (FileChange.unified_diff)."""
    shown_before, shown_after = redact_toml_pair(before, after)
    lines = difflib.unified_diff(
        (shown_before or "").splitlines(keepends=True),
        (shown_after or "").splitlines(keepends=True),
        fromfile="/dev/null" if before is None else f"a{path}",
        tofile="/dev/null" if after is None else f"b{path}",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


@dataclass(frozen=True)
class EffectiveChange:
    """One leaf of the effective containerd config that changes, and whether it is intended."""

    path: str
    before: Any
    after: Any
    intended: bool


@dataclass(frozen=True)
class StepPlan:
    """A step as planned: the action it will take, or the reason it has nothing to do."""

    kind: str
    why: str
    action: str | None = None
    noop_reason: str | None = None
    # what a reviewer must know before this step runs (a drain that would refuse, ...)
    warnings: tuple[str, ...] = ()

    @classmethod
    def acting(cls, kind: str, action: str, warnings: tuple[str, ...] = ()) -> StepPlan:
        """A step that will act; `why` is the playbook's, filled in by the planner."""
        return _STEP_PLANS.get(kind, "", action, None, warnings)

    @classmethod
    def skipping(cls, kind: str, reason: str) -> StepPlan:
        """A step with nothing to do, and why."""
        return _STEP_PLANS.get(kind, "", None, reason, ())

    def with_step(self, kind: str, why: str) -> StepPlan:
        """This plan as the playbook's step states it."""
        return _STEP_PLANS.get(kind, why, self.action, self.noop_reason, self.warnings)

    @property
    def changes(self) -> bool:
        return self.action is not None


# Step plans are values a fleet's nodes repeat (the same steps, actions and reasons): one
# object per distinct value (fields in order), not one per node and step.
_STEP_PLANS: ValueTable[StepPlan] = ValueTable(StepPlan, 4096)


@dataclass(frozen=True)
class LabelChange:
    key: str
    before: str | None
    after: str | None


@dataclass(frozen=True)
class DriverChange:
    """A node's driver change as a reviewer reads it: from -> to, its kernel, whether it
    reboots (`yes`, `no`, or the condition under which it does)."""

    mode: str
    before: str
    after: str
    kernel: str = ""
    reboot: str = ""


@dataclass(frozen=True)
class ResourceForecast:
    """One GPU resource's allocatable before -> after the plan (rollout.capacity); None where
    the facts do not say (recorded facts without the node's capacity)."""

    resource: str
    before: int | None
    after: int | None


@dataclass(frozen=True)
class Advertised:
    """What a node advertises once a change is made, each kind's `advertises(now, physical)`:
    GPU resource -> allocatable count, and what a reviewer must know of those counts (a new
    kind says its own here: a MIG layout, that it can advertise less than the card)."""

    counts: Mapping[str, int]
    caveats: tuple[str, ...] = ()


@dataclass(frozen=True)
class CapacityForecast:
    """The GPU resources of a node (or the fleet's targets, summed) before -> after the plan,
    and what a reviewer must know of the numbers."""

    resources: tuple[ResourceForecast, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodePlan:
    """What happens on one node, and what the node looks like now."""

    name: str
    containerd_version: str
    steps: tuple[StepPlan, ...]
    files: tuple[FileChange, ...] = ()
    effective_changes: tuple[EffectiveChange, ...] = ()
    effective_diff: str = ""
    # where containerd's defaults in the effective config came from (a binary, recorded data)
    defaults_source: str = ""
    shadowing: tuple[str, ...] = ()
    repairs: tuple[str, ...] = ()
    labels: tuple[LabelChange, ...] = ()
    warnings: tuple[str, ...] = ()
    unavailable: bool = False
    # live facts only: containerd service state, GPUs allocatable/capacity, taints
    status: str = ""
    driver: DriverChange | None = None
    # the node's physical GPUs: what it takes out of service while cordoned
    gpus: int = 0
    capacity: CapacityForecast = CapacityForecast()

    @property
    def changes(self) -> bool:
        return any(step.changes for step in self.steps)


@dataclass(frozen=True)
class ClusterChange:
    """A change to a cluster-wide object (a ConfigMap, the ClusterPolicy), made before wave 1."""

    kind: str
    target: str
    action: str | None
    diff: str = ""
    noop_reason: str | None = None
    # What the object held when planned, where the way back needs it (driver.version: the
    # driver version the nodes ran).
    before: str | None = None


@dataclass(frozen=True)
class TopologyGroup:
    """Targets sharing the plan's `group_by` label value: always in one wave (invariant 11)."""

    label: str  # `key=value`; "" for a node without the label, a group of its own
    nodes: tuple[str, ...]
    # max_unavailable_per_group resolved for this group; 0 when the plan sets none
    max_unavailable: int = 0


@dataclass(frozen=True)
class Wave:
    index: int
    nodes: tuple[NodePlan, ...]
    # with policy.group_by: the wave's whole groups, and the size policy.waves asked for
    # (a wave holds more when one group alone is larger: the plan says so)
    groups: tuple[TopologyGroup, ...] = ()
    size: int = 0

    @property
    def oversized(self) -> bool:
        """Whether the wave holds more nodes than policy.waves asked, to keep a group whole."""
        return bool(self.groups) and len(self.nodes) > self.size


@dataclass(frozen=True)
class Plan:
    name: str
    source: str
    facts_source: str
    changes: tuple[str, ...]
    waves: tuple[Wave, ...]
    cluster_changes: tuple[ClusterChange, ...] = ()
    max_unavailable: int = 1
    already_unavailable: tuple[str, ...] = ()
    not_targeted: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    policy: Mapping[str, Any] = field(default_factory=dict)
    # --limit as given (rollout.limit), and the targets it left out: "" and () without one
    limit: str = ""
    limited_out: tuple[str, ...] = ()
    # the targets' GPU resources summed (rollout.capacity); each node's on its NodePlan
    capacity: CapacityForecast = CapacityForecast()

    @property
    def nodes(self) -> tuple[NodePlan, ...]:
        return tuple(node for wave in self.waves for node in wave.nodes)

    @property
    def limit_note(self) -> str | None:
        """The plan's statement that --limit narrowed it, or None when it did not."""
        if not self.limit:
            return None
        left = len(self.limited_out)
        return (
            f"limited to {self.limit}: {len(self.nodes)} of the plan's "
            f"{len(self.nodes) + left} target node(s); {left} left out"
        )

    @property
    def has_changes(self) -> bool:
        return any(n.changes for n in self.nodes) or any(
            c.action is not None for c in self.cluster_changes
        )


def redact_plan(plan: Plan) -> Plan:
    """The plan as output shows it: file texts, effective changes and diffs without secrets."""
    # copies of a node share their change tuples (the planner's memo): redact each once; the
    # memo keeps every key alive, so no id is reused while it lives. What holds no secret is
    # kept as it is, so a node without one is shown as it is, not copied.
    memo: dict[int, tuple[object, tuple[Any, ...]]] = {}
    diffs: dict[str, str] = {}

    def shared(key: tuple[Any, ...], redact: Callable[[Any], Any]) -> tuple[Any, ...]:
        if id(key) not in memo:
            redacted = tuple(redact(change) for change in key)
            memo[id(key)] = (key, key if redacted == key else redacted)
        return memo[id(key)][1]

    def redacted_node(node: NodePlan) -> NodePlan:
        files = shared(node.files, FileChange.redacted)
        effective = shared(node.effective_changes, _redact_effective)
        diff = diffs.get(node.effective_diff)
        if diff is None:
            diff = diffs[node.effective_diff] = redact_diff(node.effective_diff)
        if (
            files is node.files
            and effective is node.effective_changes
            and diff == node.effective_diff
        ):
            return node
        return dataclasses.replace(
            node, files=files, effective_changes=effective, effective_diff=diff
        )

    nodes = {id(node): redacted_node(node) for node in plan.nodes}
    waves = tuple(
        dataclasses.replace(wave, nodes=tuple(nodes[id(n)] for n in wave.nodes))
        for wave in plan.waves
    )
    return dataclasses.replace(plan, waves=waves)


def _redact_effective(change: EffectiveChange) -> EffectiveChange:
    before, after = redact_change(parse_path(change.path), change.before, change.after)
    return dataclasses.replace(change, before=before, after=after)


def plan_to_data(plan: Plan) -> dict[str, Any]:
    """The plan as plain JSON-able data: every dataclass field, nothing derived."""
    data: dict[str, Any] = to_data(plan)
    return data


def plan_from_data(data: Mapping[str, Any]) -> Plan:
    """The inverse of plan_to_data; keys it does not know (derived fields) are ignored."""
    plan: Plan = _from_data(Plan, data)
    return plan


def to_data(value: Any) -> Any:
    """Any part of a plan as plain JSON-able data (plan_to_data's conversion)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [to_data(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_data(v) for k, v in value.items()}
    return value


def _from_data(cls: type[Any], data: Mapping[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name])
    return cls(**kwargs)


def _convert(hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin is tuple:
        (item, *_) = typing.get_args(hint)
        return tuple(_convert(item, v) for v in value)
    if origin in (typing.Union, types.UnionType):  # `X | None` of a dataclass X
        hint = next((a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)), hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
        return _from_data(hint, value)
    return value

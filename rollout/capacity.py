"""The capacity forecast: each GPU resource a node advertises, allocatable before -> after.

Before is the node's allocatable as the facts hold it. After starts from the node's capacity
(every device healthy: gpu.wait returns a node to service only so), less the resources none of
which is allocatable (rollout.facts.pods.advertised_now), and goes through each
change's `advertises(now, physical)` in the order the plan writes them: each change kind
says its own effect on its plan model (rollout.changes.<kind>.model), so a new kind plugs in there
and this module has no branch per kind. The fleet's forecast sums its targets'. What each
wave takes out of service is the plan summary's (rollout.plangroups.summarise).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rollout.memo import ValueTable
from rollout.plan import CapacityForecast, NodePlan, ResourceForecast

# the renderers read this module's text: the facts and the spec (pydantic) load only with the
# planner, so that `rollout --help` or a mistyped command loads neither
if TYPE_CHECKING:
    from rollout.changes.base import PlanningContext
    from rollout.facts import NodeFacts
    from rollout.spec import Spec

UNKNOWN_NOTE = (
    "the facts hold no node capacity (recorded facts without the node's capacity and "
    "allocatable): before unknown"
)
UNKNOWN = "unknown"
# a fleet's nodes repeat a few forecasts: one object per distinct value, not one per node
_FORECASTS: ValueTable[CapacityForecast] = ValueTable(CapacityForecast, 4096)


def unhealthy_note(resource: str) -> str:
    """What a reviewer must know of a node advertising fewer devices than it has now."""
    return (
        f"{resource} allocatable below its capacity now (an unhealthy device): the forecast "
        "assumes every device healthy after, as gpu.wait requires"
    )


def stale_note(resource: str, capacity: int) -> str:
    """What a reviewer must know of a resource the node's capacity still lists with none of
    it allocatable (the forecast counts it gone)."""
    return (
        f"{resource}: capacity {capacity} but none allocatable now (its device plugin stopped "
        "advertising it, which the kubelet shows for about 5 minutes, or every device is "
        "unhealthy): the forecast counts it 0"
    )


def forecast_node(
    spec: Spec, node: NodeFacts, ctx: PlanningContext | None = None
) -> CapacityForecast:
    """One node's GPU resources before -> after the spec's changes, with their caveats; with
    the planning context each change's kind says it (a MIG layout is read from the cluster),
    else its model alone."""
    from rollout.facts.gpu_operator import physical_gpus
    from rollout.facts.pods import advertised_now, gpu_counts

    known = bool(node.capacity)
    healthy = advertised_now(node.capacity, node.allocatable)
    before = gpu_counts(node.allocatable) if known else {}
    if ctx is not None:
        advertised = ctx.advertised(node)
        after, caveats = advertised.counts, list(advertised.caveats)
    else:
        after, caveats = healthy, []
        for change in spec.changes:
            alone = change.advertises(after, physical_gpus(node))
            after = alone.counts
            caveats.extend(alone.caveats)
    notes = [UNKNOWN_NOTE] if not known else []
    notes.extend(
        stale_note(name, count)
        for name, count in gpu_counts(node.capacity).items()
        if count and not healthy.get(name)
    )
    notes.extend(
        unhealthy_note(name) for name, count in healthy.items() if before.get(name, 0) < count
    )
    resources = tuple(
        ResourceForecast(name, before.get(name, 0) if known else None, after.get(name, 0))
        for name in sorted({*before, *after})
        if before.get(name, 0) or after.get(name, 0) or name in healthy
    )
    return _FORECASTS.get(resources, tuple(dict.fromkeys([*caveats, *notes])))


def forecast_fleet(nodes: Sequence[NodePlan]) -> CapacityForecast:
    """The targets' forecasts summed; a resource's side is unknown when one node's is. A note
    of some nodes but not all says how many."""
    forecasts = Counter(node.capacity for node in nodes)
    names = sorted({r.resource for forecast in forecasts for r in forecast.resources})
    resources = tuple(ResourceForecast(name, *_sum_sides(forecasts, name)) for name in names)
    noted: Counter[str] = Counter()
    for forecast, count in forecasts.items():
        for note in forecast.notes:
            noted[note] += count
    notes = tuple(
        note if count == len(nodes) else f"{note} ({count} of {len(nodes)} node(s))"
        for note, count in noted.items()
    )
    return CapacityForecast(resources, notes)


def _sum_sides(
    forecasts: Mapping[CapacityForecast, int], name: str
) -> tuple[int | None, int | None]:
    before: int | None = 0
    after: int | None = 0
    for forecast, count in forecasts.items():
        found = next((r for r in forecast.resources if r.resource == name), None)
        unknown = UNKNOWN_NOTE in forecast.notes
        side_before = found.before if found else (None if unknown else 0)
        side_after = found.after if found else (None if unknown else 0)
        before = None if before is None or side_before is None else before + side_before * count
        after = None if after is None or side_after is None else after + side_after * count
    return before, after


def describe_change(resource: ResourceForecast) -> str:
    """`nvidia.com/gpu.shared 0 -> 16`."""
    return (
        f"{resource.resource} {describe_count(resource.before)} -> {describe_count(resource.after)}"
    )


def describe_count(value: int | None) -> str:
    """A count as the forecast shows it: the number, or `unknown`."""
    return UNKNOWN if value is None else str(value)


def changed(forecast: CapacityForecast) -> tuple[ResourceForecast, ...]:
    """The resources whose count the plan changes (or whose count before is unknown)."""
    return tuple(r for r in forecast.resources if r.before != r.after)


def describe_node(forecast: CapacityForecast) -> str | None:
    """A node's capacity line where its resources change (`nvidia.com/gpu 4 -> 0,
    nvidia.com/gpu.shared 0 -> 16`); None where they stay as they are."""
    moved = changed(forecast)
    return ", ".join(describe_change(r) for r in moved) if moved else None


def fleet_lines(forecast: CapacityForecast, nodes: int) -> list[str]:
    """The fleet's table as plain lines: a heading, one `resource before -> after` row per
    resource, then the notes."""
    heading = f"GPU capacity of the {nodes} target node(s), allocatable before -> after:"
    if not forecast.resources:
        return [f"{heading} {UNKNOWN}", *(f"  note: {n}" for n in forecast.notes)]
    width = max(len(r.resource) for r in forecast.resources)
    rows = [
        f"  {r.resource:<{width}}  {describe_count(r.before)} -> {describe_count(r.after)}"
        + ("" if r.before != r.after else " (unchanged)")
        for r in forecast.resources
    ]
    return [heading, *rows, *(f"  note: {n}" for n in forecast.notes)]

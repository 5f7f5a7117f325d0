"""The MIG kind's planner: which layout each node gets, what it will advertise, and what the
plan refuses (a layout the MIG manager's ConfigMap does not define, a GPU the layout does
not fit, a node that is not MIG capable, a mixed layout under the single strategy)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from rollout.changes.base import ChangeKindPlanner, NodeWork, PlanningContext, same
from rollout.changes.mig.layout import (
    LayoutEntry,
    MigConfig,
    MigLayout,
    MigStrategy,
    UnknownDeviceId,
    advertised_resources,
    check_fit,
    gpu_entries,
    gpu_model,
    mixed_profiles,
    parse_mig_config,
    unused_memory,
)
from rollout.changes.mig.model import MigChange
from rollout.changes.mig.work import MigWork
from rollout.errors import InputError
from rollout.facts import NodeFacts
from rollout.facts.gpu_operator import physical_gpus
from rollout.facts.migmode import (
    CONFIG_KEY,
    CONFIG_LABEL,
    MigConfigError,
    MigSettings,
    NodeMig,
)
from rollout.operatornames import GPU_RESOURCE, MIG_RESOURCE_PREFIX
from rollout.plan import Advertised, LabelChange

MIG_PLAYBOOK = "mig"


@dataclass(frozen=True)
class MigPlan:
    """The plan's MIG change resolved against the cluster: strategy, config, the layout."""

    settings: MigSettings
    strategy: MigStrategy
    config: MigConfig
    layout: MigLayout


class MigKind(ChangeKindPlanner):
    """`mig:` as the planner asks it."""

    key = "mig"
    model = MigChange

    def playbook(self, change: Any) -> str:
        return MIG_PLAYBOOK

    def step_modules(self) -> tuple[ModuleType, ...]:
        from rollout.changes.mig import steps

        return (steps,)

    def cluster_reads(
        self, change: Any, cluster_policy: Mapping[str, Any]
    ) -> tuple[tuple[str, str], ...]:
        settings = MigSettings.from_cluster_policy(cluster_policy)
        return ((settings.namespace, settings.configmap),)

    def plan_node(self, ctx: PlanningContext, change: Any, node: NodeFacts) -> NodeWork:
        plan = resolve(ctx, change)
        mig = NodeMig.from_labels(node.labels)
        if mig.on_layout(plan.layout.name):
            return MigWork(
                layout=plan.layout.name,
                previous=mig.config,
                state=mig.state,
                already=f"already on layout {plan.layout.name} (state {mig.state})",
            )
        if not mig.capable:
            raise refuse(
                ctx,
                change,
                f"node {node.name} is not MIG capable (label nvidia.com/mig.capable="
                f"{node.labels.get('nvidia.com/mig.capable', '(absent)')})",
                "leave the node out of the plan's targets (select nvidia.com/mig.capable=true)",
            )
        gpus = physical_gpus(node)
        entries = node_entries(ctx, change, plan, node, gpus)
        check_node(ctx, change, plan, node, gpus)
        advertised = advertised_resources(entries, plan.strategy)
        caveats = ["MIG: a layout can advertise less than the card"]
        model = gpu_model(node.gpus.product)
        if model is not None:
            caveats = [f"MIG: {note}" for note in unused_memory(entries, model)]
        return MigWork(
            touches_node=True,
            disruptive=True,
            labels=(LabelChange(CONFIG_LABEL, mig.config, plan.layout.name),),
            layout=plan.layout.name,
            previous=mig.config,
            state=mig.state,
            advertised=advertised,
            caveats=tuple(caveats),
        )

    def advertises(
        self, ctx: PlanningContext, change: Any, node: NodeFacts, now: Mapping[str, int]
    ) -> Advertised:
        """What the node advertises once on the layout: every MIG resource and nvidia.com/gpu
        as the layout makes them under the strategy, the other resources as they are."""
        work = ctx.work(node, self.key)
        if not isinstance(work, MigWork) or work.advertised is None:
            return Advertised(dict(now))
        kept = {
            name: count
            for name, count in now.items()
            if name != GPU_RESOURCE and not name.startswith(MIG_RESOURCE_PREFIX)
        }
        zeroed = {name: 0 for name in now if name not in kept}
        return Advertised({**kept, **zeroed, **work.advertised}, work.caveats)


KIND = MigKind()


def resolve(ctx: PlanningContext, change: MigChange) -> MigPlan:
    """The change against the cluster facts, once per plan: refuses a strategy rollout does
    not plan, a disabled MIG manager, a ConfigMap the facts lack or cannot read, and a layout
    name it does not define."""
    return ctx.memo(("mig plan", same(change)), lambda: _resolve(ctx, change))


def _resolve(ctx: PlanningContext, change: MigChange) -> MigPlan:
    settings = MigSettings.from_cluster_policy(ctx.cluster.cluster_policy)
    strategies = ", ".join(s.value for s in MigStrategy)
    try:
        strategy = MigStrategy(settings.strategy)
    except ValueError:
        raise refuse(
            ctx,
            change,
            f"the ClusterPolicy's mig.strategy is {settings.strategy!r}; rollout plans MIG "
            f"layouts under {strategies}",
            "set spec.mig.strategy in the ClusterPolicy to single or mixed",
        ) from None
    if not settings.manager_enabled:
        raise refuse(
            ctx,
            change,
            "the ClusterPolicy's migManager.enabled is false: nothing would apply the layout",
            "enable the MIG manager (spec.migManager.enabled: true) first",
        )
    data = ctx.cluster.configmaps.get(settings.configmap_key)
    text = (data or {}).get(CONFIG_KEY)
    if text is None:
        said = "not found" if data is None else f"has no key {CONFIG_KEY}"
        raise refuse(
            ctx,
            change,
            f"the MIG manager's ConfigMap {settings.configmap_key} {said} in {ctx.fleet.source}",
            "check the GPU Operator's MIG manager (spec.migManager.config.name names its "
            "ConfigMap)",
        )
    try:
        config = parse_mig_config(text)
    except MigConfigError as exc:
        raise refuse(
            ctx,
            change,
            f"the MIG manager's ConfigMap {settings.configmap_key} cannot be read: {exc}",
            "fix the ConfigMap's config.yaml (mig-parted's version v1)",
        ) from exc
    layout = config.layouts.get(change.config)
    if layout is None:
        raise refuse(
            ctx,
            change,
            f"layout {change.config!r} is not defined by the MIG manager's ConfigMap "
            f"{settings.configmap_key}; it defines {', '.join(config.names()) or 'none'}",
            "name one of those layouts, or add it to the ConfigMap's mig-configs first",
        )
    return MigPlan(settings, strategy, config, layout)


def check_node(
    ctx: PlanningContext, change: MigChange, plan: MigPlan, node: NodeFacts, gpus: int
) -> None:
    """Refuse a layout the node's GPUs cannot hold, or one of several kinds of device under
    the single strategy (which advertises one kind as nvidia.com/gpu)."""
    model = gpu_model(node.gpus.product)
    if model is not None:
        problems = check_fit(plan.layout, model, gpus, node.gpus.device_ids)
        if problems:
            raise refuse(
                ctx,
                change,
                f"node {node.name}: layout {plan.layout.name!r} does not fit its "
                f"{node.gpus.product}: " + "; ".join(problems),
                "choose a layout within each GPU's 7 compute and 8 memory slices and each "
                "profile's most",
            )
    kinds = mixed_profiles(node_entries(ctx, change, plan, node, gpus))
    if plan.strategy is MigStrategy.SINGLE and len(kinds) > 1:
        raise refuse(
            ctx,
            change,
            f"node {node.name}: layout {plan.layout.name!r} makes {', '.join(kinds)} on "
            "one node, which the single MIG strategy cannot advertise (one kind per node)",
            "choose a layout of one profile, or set the ClusterPolicy's mig.strategy to mixed",
        )


def node_entries(
    ctx: PlanningContext, change: MigChange, plan: MigPlan, node: NodeFacts, gpus: int
) -> tuple[LayoutEntry, ...]:
    """What each of the node's GPUs becomes; refused where the layout (or the node's current
    one) selects GPU models by PCI device id and the facts lack the node's ids."""
    current = plan.config.layouts.get(NodeMig.from_labels(node.labels).config or "")
    try:
        return gpu_entries(plan.layout, gpus, current, node.gpus.device_ids)
    except UnknownDeviceId as exc:
        raise refuse(
            ctx,
            change,
            f"node {node.name}: layout {plan.layout.name!r} selects GPU models by PCI "
            f"device id (device-filter), and the node's facts from {ctx.fleet.source} "
            f"lack its GPUs' ids ({exc})",
            "record the facts again with `rollout facts record` (it reads the ids), or plan "
            "against the live cluster",
        ) from exc


def refuse(ctx: PlanningContext, change: MigChange, message: str, hint: str) -> InputError:
    """A MIG change rollout will not plan, located at its `config` in the plan file."""
    index = next(i for i, c in enumerate(ctx.spec.changes) if c is change)
    where = ctx.spec.location_of("changes", index, "mig", "config")
    return InputError(where, message, field="config", hint=hint)

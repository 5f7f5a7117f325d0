"""The MIG kind's planner (rollout.changes.mig.kind) from facts alone: the layout each node
gets, the no-op of a node already on it, what it forecasts under each strategy, and every
refusal, located at the change's `config`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from rollout.changes.base import PlanningContext
from rollout.changes.mig.kind import KIND
from rollout.changes.mig.model import MigChange
from rollout.changes.mig.work import MigWork
from rollout.errors import InputError, SourceLocation
from rollout.facts import ClusterFacts, FleetFacts, GpuFacts, NodeFacts
from tests.node_facts import containerd_node
from tests.unit.test_mig_layout import LAB_CONFIG

CONFIGMAP = "gpu-operator/default-mig-parted-config"
A100 = "NVIDIA A100-SXM4-40GB"


class PlanStandIn:
    """What the planner reads of a Spec: its changes and where a field is in its file."""

    def __init__(self, *changes: Any) -> None:
        self.changes = changes

    def location_of(self, *path: Any) -> SourceLocation:
        return SourceLocation("plan.yaml", 7, 15)


def make_node(
    name: str = "gpu-1",
    config: str = "all-disabled",
    state: str = "success",
    capable: str = "true",
    product: str = A100,
) -> NodeFacts:
    return replace(
        containerd_node(name),
        labels={
            "nvidia.com/mig.config": config,
            "nvidia.com/mig.config.state": state,
            "nvidia.com/mig.capable": capable,
        },
        gpus=GpuFacts(count=2, product=product),
        capacity={"nvidia.com/gpu": "2"},
        allocatable={"nvidia.com/gpu": "2"},
    )


def make_context(
    layout: str,
    *nodes: NodeFacts,
    strategy: str | None = "mixed",
    configmaps: dict[str, dict[str, str]] | None = None,
    manager: dict[str, Any] | None = None,
) -> tuple[PlanningContext, MigChange]:
    change = MigChange(config=layout)
    policy: dict[str, Any] = {"migManager": manager or {"enabled": True}}
    if strategy is not None:
        policy["mig"] = {"strategy": strategy}
    cluster = ClusterFacts(
        configmaps=configmaps
        if configmaps is not None
        else {CONFIGMAP: {"config.yaml": LAB_CONFIG}},
        cluster_policy=policy,
    )
    fleet = FleetFacts(nodes or (make_node(),), cluster, "facts/")
    return PlanningContext(PlanStandIn(change), fleet, {"mig": KIND}), change


def plan(ctx: PlanningContext, change: MigChange, node: NodeFacts | None = None) -> MigWork:
    work = KIND.plan_node(ctx, change, node or ctx.fleet.nodes[0])
    assert isinstance(work, MigWork)
    return work


def test_a_node_changing_layout_is_cordoned_drained_and_relabelled() -> None:
    ctx, change = make_context("all-1g.5gb")
    work = plan(ctx, change)
    assert (work.touches_node, work.disruptive) == (True, True)
    assert work.describe_label() == "nvidia.com/mig.config all-disabled -> all-1g.5gb"
    assert dict(work.advertised or {}) == {"nvidia.com/mig-1g.5gb": 14}
    assert work.caveats == ("MIG: 7 x 1g.5gb makes MIG devices of 35 of each A100 40GB's 40 GB",)


def test_a_node_already_on_the_layout_is_untouched() -> None:
    ctx, change = make_context("all-1g.5gb", make_node(config="all-1g.5gb"))
    work = plan(ctx, change)
    assert (work.touches_node, work.disruptive) == (False, False)
    assert work.already == "already on layout all-1g.5gb (state success)"


def test_a_node_on_the_layout_in_another_state_is_not_untouched() -> None:
    ctx, change = make_context("all-1g.5gb", make_node(config="all-1g.5gb", state="failed"))
    assert plan(ctx, change).touches_node


@pytest.mark.parametrize(
    ("layout", "strategy", "after"),
    [
        ("all-1g.5gb", "mixed", {"nvidia.com/gpu": 0, "nvidia.com/mig-1g.5gb": 14}),
        ("all-1g.5gb", "single", {"nvidia.com/gpu": 14}),
        ("all-1g.5gb", None, {"nvidia.com/gpu": 14}),  # the operator's default: single
        (
            "all-balanced",
            "mixed",
            {
                "nvidia.com/gpu": 0,
                "nvidia.com/mig-1g.5gb": 4,
                "nvidia.com/mig-2g.10gb": 2,
                "nvidia.com/mig-3g.20gb": 2,
            },
        ),
    ],
)
def test_the_forecast_of_a_layout_per_strategy(
    layout: str, strategy: str | None, after: dict[str, int]
) -> None:
    ctx, change = make_context(layout, strategy=strategy)
    node = ctx.fleet.nodes[0]
    advertised = KIND.advertises(ctx, change, node, {"nvidia.com/gpu": 2})
    assert dict(advertised.counts) == after


def test_the_forecast_zeroes_the_mig_resources_the_layout_no_longer_makes() -> None:
    ctx, change = make_context("all-disabled", make_node(config="all-1g.5gb"))
    node = ctx.fleet.nodes[0]
    now = {"nvidia.com/mig-1g.5gb": 14, "nvidia.com/gpu.shared": 3}
    advertised = KIND.advertises(ctx, change, node, now)
    assert dict(advertised.counts) == {
        "nvidia.com/gpu": 2,
        "nvidia.com/mig-1g.5gb": 0,
        "nvidia.com/gpu.shared": 3,
    }


def refusal(ctx: PlanningContext, change: MigChange, node: NodeFacts | None = None) -> str:
    with pytest.raises(InputError) as refused:
        KIND.plan_node(ctx, change, node or ctx.fleet.nodes[0])
    assert refused.value.location == SourceLocation("plan.yaml", 7, 15)
    assert refused.value.field == "config"
    return refused.value.message + " | " + (refused.value.hint or "")


def test_an_unknown_layout_is_refused_listing_the_known_ones() -> None:
    said = refusal(*make_context("all-2g.20gb"))
    assert said.startswith(
        "layout 'all-2g.20gb' is not defined by the MIG manager's ConfigMap "
        f"{CONFIGMAP}; it defines all-1g.5gb, all-3g.20gb, all-balanced, all-disabled, "
        "all-enabled, eight-small, half, too-big"
    )
    assert "name one of those layouts" in said


def test_a_layout_the_gpus_cannot_hold_is_refused_naming_node_product_and_why() -> None:
    said = refusal(*make_context("eight-small"))
    assert said.startswith(
        f"node gpu-1: layout 'eight-small' does not fit its {A100}: "
        "GPU 0 (A100 40GB): 8 x 1g.5gb, at most 7 per GPU"
    )


def test_a_mixed_layout_under_the_single_strategy_is_refused() -> None:
    said = refusal(*make_context("all-balanced", strategy="single"))
    assert "layout 'all-balanced' makes 1g.5gb, 2g.10gb, 3g.20gb on one node" in said
    assert "set the ClusterPolicy's mig.strategy to mixed" in said
    said = refusal(*make_context("half", strategy="single"))
    assert "makes 1g.5gb, MIG disabled on one node" in said


def test_a_node_that_is_not_mig_capable_is_refused() -> None:
    said = refusal(*make_context("all-1g.5gb", make_node(capable="false")))
    assert said.startswith("node gpu-1 is not MIG capable (label nvidia.com/mig.capable=false)")


def test_an_unknown_product_is_planned_without_the_fit() -> None:
    ctx, change = make_context("eight-small", make_node(product="NVIDIA B200"))
    work = plan(ctx, change)
    assert dict(work.advertised or {}) == {"nvidia.com/mig-1g.5gb": 16}
    assert work.caveats == ("MIG: a layout can advertise less than the card",)


@pytest.mark.parametrize(
    ("kw", "said"),
    [
        ({"strategy": "none"}, "the ClusterPolicy's mig.strategy is 'none'"),
        ({"manager": {"enabled": False}}, "migManager.enabled is false"),
        ({"configmaps": {}}, f"ConfigMap {CONFIGMAP} not found in facts/"),
        ({"configmaps": {CONFIGMAP: {"other": ""}}}, "has no key config.yaml"),
        (
            {"configmaps": {CONFIGMAP: {"config.yaml": "version: v2\n"}}},
            "cannot be read: version 'v2'",
        ),
    ],
)
def test_a_cluster_the_change_cannot_be_planned_on_is_refused(kw: Any, said: str) -> None:
    assert said in refusal(*make_context("all-1g.5gb", **kw))


def test_the_configmap_read_is_the_one_the_clusterpolicy_names() -> None:
    change = MigChange(config="x")
    assert KIND.cluster_reads(change, {}) == (("gpu-operator", "default-mig-parted-config"),)
    named = {"migManager": {"config": {"name": "custom-mig"}}}
    assert KIND.cluster_reads(change, named) == (("gpu-operator", "custom-mig"),)

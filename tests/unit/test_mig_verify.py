"""gpu.wait and gpu.smoke after a MIG layout: they check what the plan's capacity forecast
promises (each MIG resource at its count, a pod asking one MIG device must list a MIG-
UUID), and keep their own rule where the forecast says nothing more (time-slicing, a
containerd change)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rollout.plan import CapacityForecast, NodePlan, ResourceForecast
from rollout.run import Journal
from rollout.steps.base import StepContext, StepFailed
from rollout.steps.gates import check_resources
from rollout.steps.gpu_smoke import GpuSmokeStep, smoke_resource
from rollout.steps.gpu_wait import GpuExpectation, GpuWaitStep, forecast_expectations
from tests.unit.test_steps_kube import (
    UUIDS,
    FakeKube,
    assert_done,
    make_context,
    make_facts,
    make_spec,
)

MIXED = CapacityForecast(
    (
        ResourceForecast("nvidia.com/gpu", 2, 0),
        ResourceForecast("nvidia.com/mig-1g.5gb", 0, 14),
    )
)
SINGLE = CapacityForecast((ResourceForecast("nvidia.com/gpu", 2, 14),))
WHOLE = GpuExpectation("nvidia.com/gpu", 2, 2, 1)
FACTS = make_facts()  # whole GPUs, no MIG mode


def with_forecast(ctx: StepContext, forecast: CapacityForecast) -> StepContext:
    return replace(ctx, node_plan=replace(ctx.node_plan, capacity=forecast))


def test_the_forecast_adds_nothing_where_the_one_rule_says_it() -> None:
    plan = NodePlan("gpu-1", "1.7.24", ())
    assert forecast_expectations(plan, FACTS, WHOLE) is None
    same = CapacityForecast((ResourceForecast("nvidia.com/gpu", 1, 2),))
    assert forecast_expectations(replace(plan, capacity=same), FACTS, WHOLE) is None


def test_the_forecast_of_a_mig_layout_is_what_gpu_wait_expects() -> None:
    plan = replace(NodePlan("gpu-1", "1.7.24", ()), capacity=MIXED)
    (mig,) = forecast_expectations(plan, FACTS, WHOLE) or ()
    assert (mig.resource, mig.count) == ("nvidia.com/mig-1g.5gb", 14)
    plan = replace(plan, capacity=SINGLE)
    (gpu,) = forecast_expectations(plan, FACTS, WHOLE) or ()
    assert (gpu.resource, gpu.count) == ("nvidia.com/gpu", 14)


def test_gpu_wait_fails_a_node_still_advertising_whole_gpus(journal: Journal) -> None:
    kube = FakeKube()  # nvidia.com/gpu 2, no MIG device
    spec = make_spec(policy="policy: {verify: {gpu_wait_timeout_s: 2}}\n")
    ctx = with_forecast(make_context(kube, journal, spec=spec), MIXED)
    with pytest.raises(StepFailed, match=r"expected nvidia.com/mig-1g.5gb = 14 within 2s"):
        GpuWaitStep().apply(ctx)


def test_gpu_wait_passes_once_the_node_advertises_the_layout(journal: Journal) -> None:
    kube = FakeKube()
    # the kubelet keeps nvidia.com/gpu's capacity for a while after its plugin went
    kube.node = replace(
        kube.node,
        capacity={"nvidia.com/gpu": "2", "nvidia.com/mig-1g.5gb": "14"},
        allocatable={"nvidia.com/gpu": "0", "nvidia.com/mig-1g.5gb": "14"},
    )
    result = GpuWaitStep().apply(with_forecast(make_context(kube, journal), MIXED))
    assert_done(result, "allocatable nvidia.com/mig-1g.5gb = 14 after")


def test_the_smoke_pod_asks_one_mig_device_and_must_list_one(journal: Journal) -> None:
    kube = FakeKube()
    kube.smoke_pod = replace(kube.smoke_pod, phase="Succeeded")
    ctx = with_forecast(make_context(kube, journal), MIXED)
    assert smoke_resource(ctx) == "nvidia.com/mig-1g.5gb"
    assert smoke_resource(make_context(kube, journal)) == "nvidia.com/gpu"
    whole = f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {UUIDS[0]})\n"
    kube.read_pod_log = lambda *a, **k: whole  # type: ignore[method-assign]
    with pytest.raises(StepFailed, match=r"nvidia.com/mig-1g.5gb: no MIG- UUID"):
        GpuSmokeStep().apply(ctx)
    mig = whole + "  MIG 1g.5gb      Device  0: (UUID: MIG-ffda444c-c706-57c6-98c9-67c441a0b109)\n"
    kube.read_pod_log = lambda *a, **k: mig  # type: ignore[method-assign]
    result = GpuSmokeStep().apply(ctx)
    assert_done(result, "MIG-ffda444c-c706-57c6-98c9-67c441a0b109")


def test_the_resources_gate_reads_the_forecast_and_the_state_before_once_rolled_back(
    journal: Journal,
) -> None:
    kube = FakeKube()
    ctx = with_forecast(make_context(kube, journal), MIXED)
    # still whole GPUs: the layout is not there
    assert check_resources(ctx, kube.node) == (
        "resources: nvidia.com/mig-1g.5gb capacity None, expected 14"
    )
    # rolled back: whole GPUs are what the node had before
    assert check_resources(ctx, kube.node, rolled_back=True) is None
    kube.node = replace(
        kube.node,
        capacity={"nvidia.com/gpu": "2", "nvidia.com/mig-1g.5gb": "14"},
        allocatable={"nvidia.com/gpu": "0", "nvidia.com/mig-1g.5gb": "14"},
    )
    assert check_resources(ctx, kube.node) is None
    kube.node = replace(kube.node, allocatable={"nvidia.com/mig-1g.5gb": "13"})
    assert check_resources(ctx, kube.node) == (
        "resources: nvidia.com/mig-1g.5gb capacity 14, allocatable 13 "
        "(a device the plugin marked unhealthy)"
    )

"""MIG as a node's state, met by a change that is not MIG's (a containerd change here): the
node's labels and allocatable say whether its GPUs are in MIG mode and under which strategy
(rollout.facts.migmode); gpu.wait and the resources gate then expect the devices the node
advertises, which the plan leaves as they are, and gpu.smoke asks one of them and requires a
MIG- UUID under both strategies; DCGM's diagnostics are skipped by name, in the plan and the
run. A node not in MIG mode keeps GPUs x replicas, GPU- UUIDs and its diagnostics."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rollout.facts import NodeFacts, load_recorded_facts
from rollout.facts.migmode import MigMode, read_mig_mode
from rollout.plan import CapacityForecast, ResourceForecast
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.run import Journal
from rollout.spec import parse_spec
from rollout.steps.base import StepContext, StepFailed
from rollout.steps.gates import check_resources, gate_names, read_gates
from rollout.steps.gpu_smoke import GpuSmokeStep, smoke_resource
from rollout.steps.gpu_wait import GpuExpectation, GpuWaitStep, kept_mig_mode
from tests.examples import FACTS, PLAN
from tests.unit.test_steps_kube import (
    UUIDS,
    FakeKube,
    assert_done,
    make_context,
    make_facts,
    make_spec,
)

MIG_UUID = "MIG-ffda444c-c706-57c6-98c9-67c441a0b109"
WHOLE_LOG = f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {UUIDS[0]})\n"
MIG_LOG = WHOLE_LOG + f"  MIG 1g.5gb      Device  0: (UUID: {MIG_UUID})\n"
# GFD's labels of two A100s in layout all-1g.5gb (GFD's README, "Generated Labels")
MIXED_LABELS = {"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-1g.5gb.count": "14"}
SINGLE_LABELS = {
    "nvidia.com/mig.strategy": "single",
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
    "nvidia.com/gpu.count": "14",
}
# a wait that fails fails in seconds
QUICK = make_spec(policy="policy: {verify: {gpu_wait_timeout_s: 2, smoke_timeout_s: 2}}\n")
MIXED_ADVERTISED = {"nvidia.com/mig-1g.5gb": "14"}
SINGLE_ADVERTISED = {"nvidia.com/gpu": "14"}


def mig_facts(labels: dict[str, str], advertised: dict[str, str]) -> NodeFacts:
    """Two GPUs someone put in MIG mode: nvidia-smi still counts two GPUs."""
    return replace(make_facts(labels), capacity=advertised, allocatable=advertised)


def unmoved(advertised: dict[str, str]) -> CapacityForecast:
    """The forecast of a plan that leaves the node's devices as they are."""
    return CapacityForecast(
        tuple(ResourceForecast(name, int(n), int(n)) for name, n in advertised.items())
    )


def mig_node(
    journal: Journal, labels: dict[str, str], advertised: dict[str, str], log: str
) -> tuple[FakeKube, StepContext]:
    """A containerd change's context on a node in MIG mode, its smoke pod printing `log`."""
    kube = FakeKube()
    kube.node = replace(kube.node, labels=labels, capacity=advertised, allocatable=advertised)
    kube.smoke_pod = replace(kube.smoke_pod, phase="Succeeded")
    kube.read_pod_log = lambda *a, **k: log  # type: ignore[method-assign]
    ctx = make_context(kube, journal, spec=QUICK, facts=mig_facts(labels, advertised))
    return kube, replace(ctx, node_plan=replace(ctx.node_plan, capacity=unmoved(advertised)))


def test_the_mig_mode_is_read_from_gfd_labels_and_what_the_node_offers() -> None:
    assert read_mig_mode(MIXED_LABELS, MIXED_ADVERTISED) is MigMode.MIXED
    assert read_mig_mode({}, MIXED_ADVERTISED) is MigMode.MIXED  # GFD not caught up yet
    assert read_mig_mode(MIXED_LABELS, {}) is MigMode.MIXED  # its plugin down
    assert read_mig_mode(SINGLE_LABELS, SINGLE_ADVERTISED) is MigMode.SINGLE
    whole = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "2"}
    assert read_mig_mode(whole, {"nvidia.com/gpu": "2"}) is MigMode.OFF
    # back to all-disabled: the kubelet's capacity keeps the gone devices, at allocatable 0
    assert read_mig_mode(whole, {"nvidia.com/mig-1g.5gb": "0"}) is MigMode.OFF


def test_gpu_wait_on_a_mixed_node_waits_for_its_mig_devices(journal: Journal) -> None:
    _, ctx = mig_node(journal, MIXED_LABELS, MIXED_ADVERTISED, MIG_LOG)
    assert_done(GpuWaitStep().apply(ctx), "allocatable nvidia.com/mig-1g.5gb = 14 after")
    assert check_resources(ctx, ctx.kube.get_node(ctx.node)) is None


def test_gpu_wait_on_a_single_node_waits_for_its_mig_devices_as_gpus(journal: Journal) -> None:
    _, ctx = mig_node(journal, SINGLE_LABELS, SINGLE_ADVERTISED, MIG_LOG)
    # nvidia-smi counts 2 GPUs; the plugin advertises their 14 MIG devices as nvidia.com/gpu
    assert_done(GpuWaitStep().apply(ctx), "allocatable nvidia.com/gpu = 14 after")
    assert check_resources(ctx, ctx.kube.get_node(ctx.node)) is None


@pytest.mark.parametrize(
    ("labels", "advertised", "resource"),
    [
        (MIXED_LABELS, MIXED_ADVERTISED, "nvidia.com/mig-1g.5gb"),
        (SINGLE_LABELS, SINGLE_ADVERTISED, "nvidia.com/gpu"),
    ],
)
def test_the_smoke_pod_on_a_mig_node_asks_one_device_and_must_see_a_mig_device(
    journal: Journal, labels: dict[str, str], advertised: dict[str, str], resource: str
) -> None:
    kube, ctx = mig_node(journal, labels, advertised, MIG_LOG)
    assert smoke_resource(ctx) == resource
    assert_done(GpuSmokeStep().apply(ctx), f"(one {resource}) listed {UUIDS[0]}, {MIG_UUID}")
    kube.read_pod_log = lambda *a, **k: WHOLE_LOG  # type: ignore[method-assign]
    with pytest.raises(StepFailed, match=rf"{resource}: no MIG- UUID"):
        GpuSmokeStep().apply(ctx)


def test_a_plan_that_moves_a_single_nodes_devices_does_not_read_its_labels_before(
    journal: Journal,
) -> None:
    """A MIG layout put back to whole GPUs: the labels before it say single, the pod after
    sees whole GPUs."""
    whole = {"nvidia.com/gpu": "2"}
    kube, ctx = mig_node(journal, SINGLE_LABELS, SINGLE_ADVERTISED, WHOLE_LOG)
    back = CapacityForecast((ResourceForecast("nvidia.com/gpu", 14, 2),))
    ctx = replace(ctx, node_plan=replace(ctx.node_plan, capacity=back))
    kube.node = replace(kube.node, capacity=whole, allocatable=whole)
    assert_done(GpuSmokeStep().apply(ctx), f"(one nvidia.com/gpu) listed {UUIDS[0]}")


def test_a_node_not_in_mig_mode_keeps_whole_gpus(journal: Journal) -> None:
    kube = FakeKube()
    kube.smoke_pod = replace(kube.smoke_pod, phase="Succeeded")
    kube.read_pod_log = lambda *a, **k: WHOLE_LOG  # type: ignore[method-assign]
    ctx = make_context(kube, journal)
    ctx = replace(ctx, node_plan=replace(ctx.node_plan, capacity=unmoved({"nvidia.com/gpu": "2"})))
    assert_done(GpuWaitStep().apply(ctx), "allocatable nvidia.com/gpu = 2")
    assert smoke_resource(ctx) == "nvidia.com/gpu"
    assert_done(GpuSmokeStep().apply(ctx), f"(one nvidia.com/gpu) listed {UUIDS[0]}")


def dcgm_on(ctx: StepContext) -> StepContext:
    """`ctx` under a plan whose gates are DCGM's diagnostics alone."""
    policy = "policy:\n  verify:\n    gates: {resources: false, xid: false, validator: false, "
    spec = make_spec(policy=policy + "dcgm: {level: 1}}\n")
    return replace(ctx, spec=spec)


@pytest.mark.parametrize(
    ("labels", "advertised", "strategy"),
    [(MIXED_LABELS, MIXED_ADVERTISED, "mixed"), (SINGLE_LABELS, SINGLE_ADVERTISED, "single")],
)
def test_the_dcgm_gate_is_skipped_by_name_on_a_node_in_mig_mode(
    journal: Journal, labels: dict[str, str], advertised: dict[str, str], strategy: str
) -> None:
    kube, ctx = mig_node(journal, labels, advertised, "dcgmi never runs here")
    ctx = dcgm_on(ctx)
    skip = f"dcgm skipped: the node's GPUs are in MIG mode ({strategy} strategy), where dcgmi"
    promised = (GpuExpectation(next(iter(advertised)), 14, 2, 1),)
    names = gate_names(ctx.spec, ctx.facts, promised, MigMode(strategy))
    assert [n for n in names if n.startswith("dcgm") or "DCGM" in n] == [names[-1]]
    assert names[-1].startswith(skip)
    problem, passed = read_gates(ctx, diagnostics=True)
    assert problem == "" and passed[-1].startswith(skip)
    assert not kube.node.unschedulable
    assert kept_mig_mode(ctx.facts, ctx.node_plan.capacity.resources) is MigMode(strategy)


def test_the_dcgm_gate_runs_on_whole_gpus(journal: Journal) -> None:
    """Not in MIG mode: the diagnostic's pod is created (its log, not JSON, fails it)."""
    kube = FakeKube()
    kube.smoke_pod = replace(kube.smoke_pod, phase="Succeeded")
    kube.read_pod_log = lambda *a, **k: "dcgmi ran"  # type: ignore[method-assign]
    ctx = dcgm_on(make_context(kube, journal))
    assert "DCGM diagnostics level 1" in gate_names(ctx.spec, ctx.facts)[-1]
    problem, _ = read_gates(ctx, diagnostics=True)
    assert problem.startswith("health gate failed: dcgm:") and "no JSON document" in problem


def test_the_plan_of_a_containerd_change_on_a_mixed_node_says_what_its_steps_expect() -> None:
    """The example plan over the example facts, one node of which an operator put in MIG mode."""
    fleet = load_recorded_facts(FACTS)
    advertised = {"nvidia.com/mig-1g.5gb": "28"}
    labels = {"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-1g.5gb.count": "28"}
    first = fleet.nodes[0]
    mig = replace(
        first, labels={**first.labels, **labels}, capacity=advertised, allocatable=advertised
    )
    fleet = replace(fleet, nodes=(mig, *fleet.nodes[1:]))
    text = PLAN.read_text() + "  verify:\n    gates:\n      dcgm: {level: 1}\n"
    plan = build_plan(parse_spec(text, "plan.yaml"), "plan.yaml", fleet, load_playbooks())
    node = next(n for w in plan.waves for n in w.nodes if n.name == mig.name)
    steps = {s.kind: s.action for s in node.steps}
    assert steps["gpu.wait"] == "wait for allocatable nvidia.com/mig-1g.5gb = 28"
    assert "resources whole (nvidia.com/mig-1g.5gb = 28, allocatable = capacity)" in steps["gates"]
    assert "dcgm skipped: the node's GPUs are in MIG mode (mixed strategy)" in steps["gates"]
    other = next(n for w in plan.waves for n in w.nodes if n.name != mig.name)
    assert "DCGM diagnostics level 1" in {s.kind: s.action for s in other.steps}["gates"]

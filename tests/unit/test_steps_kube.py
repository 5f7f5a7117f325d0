"""Decisions of the Kubernetes and time-slicing steps, against an in-memory fake of KubeClient."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, cast

import pytest
import yaml

from rollout.changes.timeslicing.steps import (
    CHANGED_KEY_ANNOTATION,
    ConfigMapUpdateStep,
    DevicePluginRestartStep,
    NodeLabelStep,
)
from rollout.facts import GpuFacts, NodeFacts
from rollout.inputs.fieldproblems import shorten
from rollout.plan import NodePlan
from rollout.run import Journal
from rollout.spec import Spec, parse_spec
from rollout.steps import builtin_steps
from rollout.steps.base import StepContext, StepFailed, StepResult, StepResultKind
from rollout.steps.cordon import CordonStep, UncordonStep
from rollout.steps.deadline import Deadline
from rollout.steps.drain import DrainStep
from rollout.steps.gates import GatesFailAfterRollback
from rollout.steps.gpu_smoke import (
    SMOKE_SCRIPT,
    GpuSmokeStep,
    judge_smoke_log,
    parse_gpu_uuids,
    smoke_pod_manifest,
    smoke_pod_name,
)
from rollout.steps.gpu_wait import GpuExpectation, GpuWaitStep, expect_gpus
from rollout.steps.nodemarks import (
    LEFT_CORDONED_ANNOTATION,
    STEP_ANNOTATION,
    event_reason,
    mark_left_cordoned,
)
from rollout.transports.errors import Conflict, EvictionBlocked, Forbidden, KubeError, NotFound
from rollout.transports.kube import (
    ConfigMap,
    DaemonSet,
    Event,
    EventType,
    EvictionOutcome,
    KubeClient,
    Node,
    OwnerRef,
    Pod,
)
from rollout.transports.local import LocalRunner
from tests.fakes import InMemoryKube
from tests.node_facts import containerd_node

NODE = "gpu-1"
UUIDS = ("GPU-11111111-2222-3333-4444-555555555555", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
PROFILE_LABEL = "nvidia.com/device-plugin.config"

BASE_SPEC = """
apiVersion: rollout/v1
kind: Plan
metadata: {name: unit}
targets: {nodes: [gpu-1]}
changes:
"""
CONTAINERD_CHANGE = "  - containerd: {settings: {enable_cdi: true}}\n"
SLICING_CHANGE = """  - time-slicing:
      profile: a100-4x
      config:
        sharing:
          timeSlicing:
            renameByDefault: RENAME
            resources: [{name: nvidia.com/gpu, replicas: 4}]
"""


def make_spec(*, slicing: bool = False, rename: bool = False, policy: str = "") -> Spec:
    change = SLICING_CHANGE.replace("RENAME", str(rename).lower()) if slicing else CONTAINERD_CHANGE
    return parse_spec(BASE_SPEC + change + policy, "unit.yaml")


def make_facts(labels: Mapping[str, str] | None = None, gpus: int = 2) -> NodeFacts:
    return replace(
        containerd_node(NODE),
        labels=dict(labels or {}),
        gpus=GpuFacts(count=gpus, product="NVIDIA A100-SXM4-40GB", uuids=UUIDS[:gpus]),
    )


class FakeKube(InMemoryKube):
    """One GPU node, its pods, ConfigMaps and the ClusterPolicy; records what the steps did."""

    def __init__(self) -> None:
        super().__init__(
            Node(
                name=NODE,
                uid="n1",
                resource_version="1",
                conditions={"Ready": "True"},
                # its two GPUs advertised whole: the health gates a rollback reads pass
                capacity={"nvidia.com/gpu": "2"},
                allocatable={"nvidia.com/gpu": "2"},
            )
        )
        self.configmaps: dict[tuple[str, str], ConfigMap] = {}
        self.policy: dict[str, Any] = {
            "metadata": {"name": "cluster-policy"},
            "spec": {"devicePlugin": {"config": {"name": "", "default": ""}}},
        }
        self.evictions: list[str] = []
        self.blocked: dict[str, str] = {}  # pod name -> PDB refusing its eviction
        self.conflicts = 0  # replace_configmap answers Conflict this many times first
        self.versions = itertools.count(2)
        # the operator's DaemonSets, one list per read (the last one repeats)
        self.daemonset_reads: list[list[DaemonSet]] = [[]]
        # what create_pod makes of a smoke pod, and the Events on pods, oldest first
        self.smoke_pod = Pod("", "", uid="smoke", resource_version="1", phase="Failed")
        self.pod_events: list[Event] = []
        self.events_refused: KubeError | None = None
        self.event_selectors: list[str] = []

    def list_events(
        self, namespace: str | None = None, field_selector: str | None = None
    ) -> list[Event]:
        if self.events_refused is not None:
            raise self.events_refused
        self.event_selectors.append(field_selector or "")
        return list(self.pod_events)

    def list_daemonsets(self, namespace: str | None = None) -> list[DaemonSet]:
        if len(self.daemonset_reads) > 1:
            return self.daemonset_reads.pop(0)
        return self.daemonset_reads[0]

    def list_nodes(self, label_selector: str | None = None) -> list[Node]:
        return [self.node]

    # pods
    def get_pod(self, namespace: str, name: str) -> Pod:
        try:
            return self.pods[(namespace, name)]
        except KeyError:
            raise NotFound("get", f"pod {namespace}/{name}", status=404) from None

    def evict_pod(
        self, namespace: str, name: str, grace_period_s: int | None = None
    ) -> EvictionOutcome:
        if name in self.blocked:
            raise EvictionBlocked(
                "evict", f"pod {namespace}/{name}", status=429, reason="", message="",
                pdb=self.blocked[name],
            )  # fmt: skip
        self.evictions.append(name)
        self.pods.pop((namespace, name), None)
        return EvictionOutcome.EVICTED

    def create_pod(self, namespace: str, manifest: Mapping[str, Any]) -> Pod:
        name = manifest["metadata"]["name"]
        pod = replace(self.smoke_pod, namespace=namespace, name=name)
        self.pods[(namespace, name)] = pod
        return pod

    def delete_pod(
        self, namespace: str, name: str, grace_period_s: int | None = None, *, missing_ok: bool
    ) -> bool:
        return self.pods.pop((namespace, name), None) is not None

    def read_pod_log(
        self, namespace: str, name: str, container: str | None = None, tail_lines: int | None = None
    ) -> str:
        if self.smoke_pod.phase == "Pending":  # never started: no log (the API's 400)
            raise KubeError("read", f"log of pod {namespace}/{name}", status=400)
        return "Failed to initialize NVML: Driver/library version mismatch\n"

    # configmaps and the ClusterPolicy
    def get_configmap(self, namespace: str, name: str) -> ConfigMap:
        try:
            return self.configmaps[(namespace, name)]
        except KeyError:
            raise NotFound("get", f"configmap {namespace}/{name}", status=404) from None

    def create_configmap(self, configmap: ConfigMap) -> ConfigMap:
        stored = replace(configmap, resource_version=str(next(self.versions)))
        self.configmaps[(configmap.namespace, configmap.name)] = stored
        return stored

    def replace_configmap(self, configmap: ConfigMap) -> ConfigMap:
        key = (configmap.namespace, configmap.name)
        if self.conflicts:
            self.conflicts -= 1
            # someone else wrote another key meanwhile
            other = self.configmaps[key]
            self.configmaps[key] = replace(
                other.with_data({**other.data, "late": "x"}),
                resource_version=str(next(self.versions)),
            )
            raise Conflict("replace", "configmap", status=409)
        assert configmap.resource_version == self.configmaps[key].resource_version
        return self.create_configmap(configmap)

    def list_cluster_policies(self) -> list[dict[str, Any]]:
        return [self.policy]

    def patch_cluster_policy(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        config = self.policy["spec"]["devicePlugin"]["config"]
        config.update(patch["spec"]["devicePlugin"]["config"])
        return self.policy


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


def make_context(
    kube: FakeKube,
    journal: Journal,
    spec: Spec | None = None,
    facts: NodeFacts | None = None,
    lines: list[str] | None = None,
) -> StepContext:
    return StepContext(
        node=NODE,
        node_plan=NodePlan(name=NODE, containerd_version="1.7.24", steps=()),
        facts=facts or make_facts(),
        spec=spec or make_spec(),
        runner=LocalRunner(),
        kube=cast(KubeClient, kube),
        journal=journal,
        progress=(lines.append if lines is not None else lambda _: None),
        sleep=lambda _: None,
    )


def assert_done(result: StepResult, says: str) -> None:
    """The step acted, and its one line for the journal says `says`."""
    assert result.kind is StepResultKind.DONE, result
    assert says in result.detail, result.detail


# ------------------------------------------------------------------ registry and plumbing


def test_every_kind_of_the_playbooks_is_registered() -> None:
    kinds = set(builtin_steps())
    expected = {"cordon", "drain", "uncordon", "gpu.wait", "gpu.smoke"}
    expected |= {"configmap.update", "node.label", "deviceplugin.restart"}
    assert expected <= kinds


@pytest.mark.parametrize(
    ("kind", "reason"),
    [("cordon", "RolloutCordon"), ("gpu.smoke", "RolloutGpuSmoke"),
     ("deviceplugin.restart", "RolloutDevicepluginRestart")],
)  # fmt: skip
def test_event_reasons_are_camel_case(kind: str, reason: str) -> None:
    assert event_reason(kind) == reason


def test_a_deadline_counts_fake_sleeps() -> None:
    slept: list[float] = []
    deadline = Deadline(3.0, slept.append)
    while not deadline.expired:
        deadline.sleep(2.0)
    assert slept == [2.0, 1.0]


# ------------------------------------------------------------------ cordon and uncordon


def test_cordon_journals_then_cordons_and_marks_the_node(kube: FakeKube, journal: Journal) -> None:
    ctx = make_context(kube, journal)
    result = CordonStep().apply(ctx)
    assert result.kind is StepResultKind.DONE
    assert kube.node.unschedulable
    assert journal.replay().node(NODE).cordoned_by_rollout
    assert kube.node.annotations["rollout.dev/run"] == journal.run_id
    assert kube.node.annotations["rollout.dev/step"] == "cordon"
    assert kube.events[-1][0] == "RolloutCordon"
    # again (resume): a no-op that still counts the cordon as rollout's
    assert CordonStep().apply(ctx).detail == "already cordoned by this run"
    result = UncordonStep().apply(ctx)
    assert result.kind is StepResultKind.DONE and not kube.node.unschedulable
    assert not journal.replay().node(NODE).cordoned_by_rollout
    assert UncordonStep().apply(ctx).detail == "already uncordoned by this run"


def test_a_node_cordoned_by_someone_else_stays_cordoned(kube: FakeKube, journal: Journal) -> None:
    kube.node = replace(kube.node, unschedulable=True)
    ctx = make_context(kube, journal)
    result = CordonStep().apply(ctx)
    assert (result.kind, result.detail) == (
        StepResultKind.NOOP,
        "cordoned by someone else; stays cordoned",
    )
    assert ctx.load_data("cordon") == {"cordoned_by_rollout": False, "cordoned_before": True}
    assert UncordonStep().apply(ctx).detail == "cordoned by someone else; stays cordoned"
    CordonStep().undo(ctx)
    assert kube.node.unschedulable
    assert not journal.replay().node(NODE).cordoned_by_rollout


def test_undo_of_uncordon_cordons_again(kube: FakeKube, journal: Journal) -> None:
    ctx = make_context(kube, journal)
    CordonStep().apply(ctx)
    UncordonStep().apply(ctx)
    UncordonStep().undo(ctx)
    assert kube.node.unschedulable and journal.replay().node(NODE).cordoned_by_rollout
    CordonStep().undo(ctx)
    assert not kube.node.unschedulable


def test_a_rolled_back_node_whose_gates_fail_is_not_given_back(
    kube: FakeKube, journal: Journal
) -> None:
    """Invariant 10 on the way back: the cordon's undo reads the node's health gates first
    (until gpu_wait_timeout_s), and a node whose plugin marked a device unhealthy during the
    change stays cordoned with the evidence; once whole, the undo uncordons it."""
    spec = make_spec(
        policy="policy: {verify: {gpu_wait_timeout_s: 20, gates: {xid: false, validator: false}}}\n"
    )
    facts = replace(make_facts(), capacity={"nvidia.com/gpu": "2"})
    ctx = make_context(kube, journal, spec=spec, facts=facts)
    CordonStep().apply(ctx)
    kube.node = replace(
        kube.node, capacity={"nvidia.com/gpu": "2"}, allocatable={"nvidia.com/gpu": "1"}
    )
    with pytest.raises(GatesFailAfterRollback, match="capacity 2, allocatable 1") as failed:
        CordonStep().undo(ctx)
    assert failed.value.leaves_node_cordoned
    assert kube.node.unschedulable and journal.replay().node(NODE).cordoned_by_rollout
    kube.node = replace(kube.node, allocatable={"nvidia.com/gpu": "2"})
    CordonStep().undo(ctx)
    assert not kube.node.unschedulable


def test_a_node_left_cordoned_says_why_until_rollout_releases_it(
    kube: FakeKube, journal: Journal
) -> None:
    ctx = make_context(kube, journal)
    CordonStep().apply(ctx)
    DrainStep().apply(ctx)
    reason = "gpu.wait: timed out\n  details; rollback failed at containerd.write: backup missing"
    mark_left_cordoned(ctx, reason)
    notes = kube.node.annotations
    assert notes[LEFT_CORDONED_ANNOTATION] == (
        "gpu.wait: timed out details; rollback failed at containerd.write: backup missing"
    )
    assert notes[STEP_ANNOTATION] == "rollback", "no longer the stale `drain`"
    assert notes["rollout.dev/run"] == journal.run_id
    reason_, message, type_ = kube.events[-1]
    assert (reason_, type_) == ("RolloutLeftCordoned", EventType.WARNING)
    assert journal.run_id in message and "backup missing" in message
    assert f"kubectl uncordon {NODE}" in message and f"rollout status {journal.run_id}" in message
    assert "rollout rollback" not in message, "no command that does not exist"
    # when rollout itself uncordons it, the mark goes and an Event supersedes the warning
    CordonStep().undo(ctx)
    assert not kube.node.unschedulable
    assert LEFT_CORDONED_ANNOTATION not in kube.node.annotations
    assert kube.events[-1][0] == "RolloutReleased"
    assert kube.events[-1][2] is EventType.NORMAL and "backup missing" in kube.events[-1][1]


def test_a_schedulable_node_is_not_marked_left_cordoned(kube: FakeKube, journal: Journal) -> None:
    ctx = make_context(kube, journal)
    mark_left_cordoned(ctx, "node.label: refused; rollback failed at configmap.update: gone")
    assert LEFT_CORDONED_ANNOTATION not in kube.node.annotations
    assert kube.events[-1][0] == "RolloutLeftCordoned"
    assert "the node is schedulable" in kube.events[-1][1]
    # an uncordon of a node that carries no mark adds no Event of its own
    CordonStep().apply(ctx)
    count = len(kube.events)
    CordonStep().undo(ctx)
    assert len(kube.events) == count


def test_progress_marks_never_fail_a_step(kube: FakeKube, journal: Journal) -> None:
    def refuse(*_: Any, **__: Any) -> str:
        raise NotFound("create", "event", status=404)

    kube.create_event = refuse  # type: ignore[method-assign]
    lines: list[str] = []
    assert CordonStep().apply(make_context(kube, journal, lines=lines)).kind is StepResultKind.DONE
    assert "could not record progress" in lines[-1]


# ---------------------------------------------------------------------------------- drain


def add_pod(kube: FakeKube, name: str, owner: str | None = "ReplicaSet", **kw: Any) -> Pod:
    owners = (OwnerRef(owner, f"{name}-owner", controller=True),) if owner else ()
    pod = Pod("ml", name, uid=f"uid-{name}", resource_version="1", node_name=NODE, owners=owners)
    pod = replace(pod, phase="Running", **kw)
    kube.pods[("ml", name)] = pod
    return pod


def test_drain_evicts_managed_pods_and_skips_daemonset_ones(
    kube: FakeKube, journal: Journal
) -> None:
    add_pod(kube, "web")
    add_pod(kube, "plugin", owner="DaemonSet")
    ctx = make_context(kube, journal)
    result = DrainStep().apply(ctx)
    assert result.kind is StepResultKind.DONE
    assert kube.evictions == ["web"]
    assert ctx.load_data("drain") == {"evicted": ["ml/web"]}
    assert DrainStep().apply(ctx).kind is StepResultKind.NOOP


def test_drain_refuses_an_unmanaged_pod_without_force(kube: FakeKube, journal: Journal) -> None:
    add_pod(kube, "web")
    add_pod(kube, "bare", owner=None)
    with pytest.raises(StepFailed) as failed:
        DrainStep().apply(make_context(kube, journal))
    assert "ml/bare: cannot delete Pods that declare no controller" in str(failed.value)
    assert kube.evictions == []  # kubectl refuses before it evicts anything
    assert kube.events[-1][2] is EventType.WARNING


def test_drain_with_force_evicts_an_unmanaged_pod_and_warns(
    kube: FakeKube, journal: Journal
) -> None:
    add_pod(kube, "bare", owner=None)
    lines: list[str] = []
    spec = make_spec(policy="policy: {drain: {force: true}}\n")
    DrainStep().apply(make_context(kube, journal, spec=spec, lines=lines))
    assert kube.evictions == ["bare"]
    assert any("deleting Pods that declare no controller: ml/bare" in line for line in lines)


def test_drain_names_the_budget_when_it_times_out(kube: FakeKube, journal: Journal) -> None:
    add_pod(kube, "web")
    add_pod(kube, "db")
    kube.blocked["db"] = "db-pdb"
    lines: list[str] = []
    spec = make_spec(policy="policy: {drain: {timeout_s: 7}}\n")
    with pytest.raises(StepFailed) as failed:
        DrainStep().apply(make_context(kube, journal, spec=spec, lines=lines))
    assert "drain of gpu-1 timed out after 7s: pod ml/db is protected by PodDisruptionBudget " \
        "ml/db-pdb (0 disruptions allowed)" in str(failed.value)  # fmt: skip
    assert kube.evictions == ["web"]
    # the EvictionBackoff schedule for 7 s: 1, 2, 4
    assert [line.split("retrying in ")[1].split("s:")[0] for line in lines] == ["1", "2", "4"]


# ------------------------------------------------------------------------------- gpu.wait


@pytest.mark.parametrize(
    ("slicing", "rename", "labels", "expected"),
    [
        (False, False, {}, GpuExpectation("nvidia.com/gpu", 2, 2, 1)),
        (False, False, {"nvidia.com/gpu.replicas": "3"}, GpuExpectation("nvidia.com/gpu", 6, 2, 3)),
        (False, False, {"nvidia.com/gpu.replicas": "x"}, GpuExpectation("nvidia.com/gpu", 2, 2, 1)),
        (True, False, {"nvidia.com/gpu.replicas": "3"}, GpuExpectation("nvidia.com/gpu", 8, 2, 4)),
        (True, True, {}, GpuExpectation("nvidia.com/gpu.shared", 8, 2, 4)),
    ],
)  # fmt: skip
def test_expected_gpus(
    slicing: bool, rename: bool, labels: dict[str, str], expected: GpuExpectation
) -> None:
    assert expect_gpus(make_spec(slicing=slicing, rename=rename), make_facts(labels)) == expected


def test_a_plan_without_a_profile_keeps_the_renamed_resource_the_node_advertises(
    kube: FakeKube, journal: Journal
) -> None:
    """A registry change on a node whose profile renames shared GPUs (renameByDefault): the
    node advertises nvidia.com/gpu.shared, none as nvidia.com/gpu, and gpu.wait, gpu.smoke and
    the gates must expect that name (they waited for nvidia.com/gpu = 8 until the timeout)."""
    shared = {"nvidia.com/gpu.shared": "8", "nvidia.com/gpu": "0"}
    facts = replace(make_facts({"nvidia.com/gpu.replicas": "4"}), capacity=shared)
    assert expect_gpus(make_spec(), facts) == GpuExpectation("nvidia.com/gpu.shared", 8, 2, 4)
    kube.node = replace(
        kube.node,
        labels={**kube.node.labels, "nvidia.com/gpu.replicas": "4"},
        capacity=shared,
        allocatable=shared,
    )
    result = GpuWaitStep().apply(make_context(kube, journal))
    assert_done(result, "allocatable nvidia.com/gpu.shared = 8")


def test_gpu_wait_returns_when_allocatable_matches(kube: FakeKube, journal: Journal) -> None:
    kube.node = replace(
        kube.node, capacity={"nvidia.com/gpu": "2"}, allocatable={"nvidia.com/gpu": "2"}
    )
    assert_done(GpuWaitStep().apply(make_context(kube, journal)), "allocatable nvidia.com/gpu = 2")


def test_gpu_wait_follows_the_profile_the_restarted_plugin_loads(
    kube: FakeKube, journal: Journal
) -> None:
    """A plan without a profile of its own waits for what the node's plugin loads: a plugin
    that could not start before (a lost handler) loads a 2x profile only now, and GFD's
    gpu.replicas label says so; the facts still carry the 1 of before."""
    kube.node = replace(
        kube.node,
        labels={**kube.node.labels, "nvidia.com/gpu.replicas": "2"},
        capacity={"nvidia.com/gpu": "4"},
        allocatable={"nvidia.com/gpu": "4"},
    )
    facts = make_facts({"nvidia.com/gpu.replicas": "1"})
    result = GpuWaitStep().apply(make_context(kube, journal, facts=facts))
    assert_done(result, "nvidia.com/gpu = 4 (2 GPUs x 2 replicas)")
    # a plan that sets the profile keeps its own expectation whatever the label says
    spec = make_spec(slicing=True, policy="policy: {verify: {gpu_wait_timeout_s: 1}}\n")
    with pytest.raises(StepFailed, match=r"expected nvidia\.com/gpu = 8"):
        GpuWaitStep().apply(make_context(kube, journal, spec=spec, facts=facts))


def test_gpu_wait_explains_a_lost_device_plugin(kube: FakeKube, journal: Journal) -> None:
    kube.node = replace(
        kube.node, capacity={"nvidia.com/gpu": "2"}, allocatable={"nvidia.com/gpu": "0"}
    )
    add_pod(
        kube,
        "nvidia-device-plugin-daemonset-x",
        owner="DaemonSet",
        labels={"app": "nvidia-device-plugin-daemonset"},
        container_reasons=("CrashLoopBackOff",),
    )
    spec = make_spec(policy="policy: {verify: {gpu_wait_timeout_s: 3}}\n")
    with pytest.raises(StepFailed) as failed:
        GpuWaitStep().apply(make_context(kube, journal, spec=spec))
    message = str(failed.value)
    assert "expected nvidia.com/gpu = 2 within 3s" in message
    assert "capacity 2, allocatable 0" in message
    assert "the kubelet lost the device plugin" in message
    assert "pod ml/nvidia-device-plugin-daemonset-x: Running, not ready" in message
    assert "CrashLoopBackOff" in message


# ------------------------------------------------------------------------------ gpu.smoke

SMI = (
    f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {UUIDS[0]})\n"
    "  MIG 1g.5gb      Device  0: (UUID: MIG-ffda444c-c706-57c6-98c9-67c441a0b109)\n"
)


@pytest.mark.parametrize(
    ("log", "uuids"),
    [
        (SMI, (UUIDS[0], "MIG-ffda444c-c706-57c6-98c9-67c441a0b109")),
        (f"  MIG Device 0: (UUID: MIG-{UUIDS[1]}/1/0)\n", (f"MIG-{UUIDS[1]}/1/0",)),
        (f"{UUIDS[0]}, {UUIDS[0]}\n", (UUIDS[0],)),  # a format change: still found, once
        ("No devices were found\n", ()),
    ],
)
def test_parse_gpu_uuids(log: str, uuids: tuple[str, ...]) -> None:
    assert parse_gpu_uuids(log) == uuids


def test_judge_smoke_log() -> None:
    assert judge_smoke_log(SMI, UUIDS).ok
    assert judge_smoke_log(f"MIG-{UUIDS[1]}/1/0", UUIDS).ok
    # the hex digits' case is not significant
    assert judge_smoke_log(f"GPU 1: X (UUID: {UUIDS[1]})", [UUIDS[1].upper()]).ok
    assert judge_smoke_log("No devices were found", UUIDS).problems == (
        "nvidia-smi -L listed no GPU",
    )
    stranger = "GPU 0: X (UUID: GPU-99999999-2222-3333-4444-555555555555)"
    (problem,) = judge_smoke_log(stranger, UUIDS).problems
    assert problem.startswith("GPU-99999999-2222-3333-4444-555555555555 is not one of the node's")
    (problem,) = judge_smoke_log("MIG-GPU-99999999-0000/1/0", UUIDS).problems
    assert "is not one of the node's GPUs" in problem
    assert judge_smoke_log(stranger, ()).ok  # nothing known to compare with


def test_the_smoke_pod_must_see_the_plans_driver() -> None:
    log = SMI + "550.90.07\n"
    assert judge_smoke_log(log, UUIDS).drivers == ("550.90.07",)
    assert judge_smoke_log(log, UUIDS, "550.90.07").ok
    (problem,) = judge_smoke_log(log, UUIDS, "560.35.03").problems
    assert problem == "the pod sees driver 550.90.07, not 560.35.03"
    (problem,) = judge_smoke_log(SMI, UUIDS, "560.35.03").problems
    assert problem == "the pod sees driver (none reported), not 560.35.03"
    mismatch = "Failed to initialize NVML: Driver/library version mismatch\n"
    assert (
        judge_smoke_log(mismatch, UUIDS, "560.35.03")
        .problems[0]
        .endswith("(none reported), not 560.35.03")
    )


def test_the_smoke_pod_goes_through_the_scheduler_to_the_cordoned_node() -> None:
    name = smoke_pod_name(NODE, "20240501-100000-unit-ab12")
    assert name == smoke_pod_name(NODE, "20240501-100000-unit-ab12")  # same on every attempt
    assert name.startswith(f"rollout-smoke-{NODE}-") and len(name) == len(NODE) + 21
    spec = smoke_pod_manifest(name, NODE, "run", "cuda:12")["spec"]
    assert "nodeName" not in spec
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [NODE]
    assert {"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
            "effect": "NoSchedule"} in spec["tolerations"]  # fmt: skip
    (container,) = spec["containers"]
    assert container["command"] == ["sh", "-c", SMOKE_SCRIPT]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert spec["runtimeClassName"] == "nvidia" and spec["restartPolicy"] == "Never"


def test_a_failed_smoke_pod_is_described_and_deleted(kube: FakeKube, journal: Journal) -> None:
    ctx = make_context(kube, journal)
    with pytest.raises(StepFailed) as failed:
        GpuSmokeStep().apply(ctx)
    assert "Failed" in str(failed.value) and "Driver/library version mismatch" in str(failed.value)
    assert kube.pods == {}


def smoke_event(reason: str, message: str, count: int = 1, at: int = 0) -> Event:
    """An Event on the smoke pod, `at` seconds into the minute."""
    return Event(
        "default",
        f"e{at}",
        "Pod",
        "smoke",
        reason,
        message,
        "Normal" if reason == "Scheduled" else "Warning",
        count,
        datetime(2024, 5, 1, 10, 0, at, tzinfo=UTC),
    )


def smoke_failure(kube: FakeKube, journal: Journal) -> str:
    ctx = make_context(kube, journal)
    with pytest.raises(StepFailed) as failed:
        GpuSmokeStep().apply(ctx)
    assert kube.pods == {}
    # the events of this pod, not of an earlier one of the same name
    name = smoke_pod_name(NODE, ctx.run_id)
    assert kube.event_selectors[-1:] in (
        [],
        [f"involvedObject.kind=Pod,involvedObject.name={name},involvedObject.uid=smoke"],
    )
    return str(failed.value)


STUCK = Pod("", "", "smoke", "1", NODE, "Pending", container_reasons=("ContainerCreating",))
NO_GRPC = "Failed to create pod sandbox: grpc is not installed"


def test_a_smoke_pod_stuck_creating_quotes_its_latest_warning_events(
    kube: FakeKube, journal: Journal
) -> None:
    """The kubelet's Warning events say why (here the lab's CRI client could not load): the
    failure quotes the latest three, and blames no runtime handler nor a missing log."""
    kube.smoke_pod = STUCK
    kube.pod_events = [
        smoke_event("Scheduled", "Successfully assigned", at=0),
        smoke_event("FailedMount", "an old one", at=1),
        smoke_event("Failed", "Error: ImagePullBackOff", at=2),
        smoke_event("FailedCreatePodSandBox", f"{NO_GRPC} (pip install)", 4, at=3),
        smoke_event("FailedCreatePodSandBox", "x" * 500, at=4),
    ]
    said = smoke_failure(kube, journal)
    lines = said.splitlines()
    assert lines[0].endswith("containers: ContainerCreating: not finished after 300s "
                             "(policy.verify.smoke_timeout_s)")  # fmt: skip
    assert lines[1:] == [
        "  warning events, latest first:",
        f"    {shorten('Warning FailedCreatePodSandBox: ' + 'x' * 500, 300)}",
        f"    Warning FailedCreatePodSandBox: {NO_GRPC} (pip install) (x4)",
        "    Warning Failed: Error: ImagePullBackOff",
    ]
    assert len(lines[2].strip()) == 300


def test_a_smoke_pod_whose_handler_is_missing_is_blamed_on_the_handler(
    kube: FakeKube, journal: Journal
) -> None:
    kube.smoke_pod = STUCK
    missing = (
        "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox "
        'runtime: no runtime for "nvidia" is configured'
    )
    kube.pod_events = [smoke_event("FailedCreatePodSandBox", missing)]
    said = smoke_failure(kube, journal)
    assert f"    Warning FailedCreatePodSandBox: {missing}\n" in said
    assert said.endswith(
        "  containerd on the node has no `nvidia` runtime handler (the pod's RuntimeClass "
        "names it): check what containerd loads (rollout diagnose)"
    )


def test_a_smoke_pod_stuck_without_events_says_so(kube: FakeKube, journal: Journal) -> None:
    kube.smoke_pod = STUCK
    said = smoke_failure(kube, journal)
    assert said.splitlines()[1:] == [
        "  stuck creating, and no Warning event says why (kubectl describe pod)"
    ]
    kube.events_refused = Forbidden("list", "events in default", status=403)
    said = smoke_failure(kube, journal)
    assert said.splitlines()[1].startswith("  its events could not be read: ")
    assert "runtime handler" not in said


# ------------------------------------------------------------------------- time-slicing


def slicing_context(kube: FakeKube, journal: Journal, **kw: Any) -> StepContext:
    return make_context(kube, journal, spec=make_spec(slicing=True), **kw)


def test_configmap_update_keeps_other_keys_and_retries_conflicts(
    kube: FakeKube, journal: Journal
) -> None:
    ref = ("gpu-operator", "time-slicing-config")
    kube.configmaps[ref] = ConfigMap(*ref, data={"other": "keep"}, resource_version="1")
    kube.conflicts = 1
    lines: list[str] = []
    ctx = slicing_context(kube, journal, lines=lines)
    result = ConfigMapUpdateStep().apply(ctx)
    assert result.kind is StepResultKind.DONE
    stored = kube.configmaps[ref]
    assert set(stored.data) == {"other", "late", "a100-4x"}
    document = yaml.safe_load(stored.data["a100-4x"])
    assert document["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/gpu", "replicas": 4}
    ]
    assert stored.annotations[CHANGED_KEY_ANNOTATION] == "a100-4x"
    assert kube.policy["spec"]["devicePlugin"]["config"]["name"] == "time-slicing-config"
    assert any("shares each GPU, it does not divide it" in line for line in lines)
    saved = ctx.load_data("configmap.update")
    assert saved["previous"] is None and saved["content_changed"] is True
    assert saved["policy_name_before"] == ""
    assert "the GPU Operator restarted no operand; GPU nodes Ready" in result.detail
    # a second node of the run: nothing to do, but it knows the content changed in this run
    again = ConfigMapUpdateStep().apply(ctx)
    assert again.kind is StepResultKind.NOOP
    assert again.detail == "key 'a100-4x' already holds this profile"
    ConfigMapUpdateStep().undo(ctx)
    assert set(kube.configmaps[ref].data) == {"other", "late"}
    assert CHANGED_KEY_ANNOTATION not in kube.configmaps[ref].annotations
    assert kube.policy["spec"]["devicePlugin"]["config"]["name"] == ""


def plugin_daemonset(updated: int, ready: int) -> DaemonSet:
    return DaemonSet(
        "gpu-operator", "nvidia-device-plugin-daemonset", desired=2, updated=updated, ready=ready
    )


def test_configmap_update_waits_for_the_operator_to_roll_its_operands(
    kube: FakeKube, journal: Journal
) -> None:
    """The ClusterPolicy write restarts operands on every node: the step returns once the
    rollout is over and has stayed over, so the next node does not start inside it."""
    kube.daemonset_reads = [
        [plugin_daemonset(2, 2)],  # the operator has not reacted yet
        [plugin_daemonset(0, 2)],
        [plugin_daemonset(1, 1)],
        [plugin_daemonset(2, 2)],
    ]
    result = ConfigMapUpdateStep().apply(slicing_context(kube, journal))
    assert_done(result, "the GPU Operator rolled out its operands; GPU nodes Ready")


def test_configmap_update_fails_when_the_operator_never_settles(
    kube: FakeKube, journal: Journal
) -> None:
    kube.daemonset_reads = [[plugin_daemonset(1, 1)]]
    spec = make_spec(slicing=True, policy="policy: {verify: {gpu_wait_timeout_s: 3}}\n")
    with pytest.raises(StepFailed) as failed:
        ConfigMapUpdateStep().apply(make_context(kube, journal, spec=spec))
    assert "did not settle" in str(failed.value)
    assert "daemonset nvidia-device-plugin-daemonset: 1 updated, 1 ready of 2" in str(failed.value)


def test_node_label_saves_the_previous_value_and_undo_restores_it(
    kube: FakeKube, journal: Journal
) -> None:
    ctx = slicing_context(kube, journal)
    with pytest.raises(StepFailed, match=r"configmap\.update must run first"):
        NodeLabelStep().apply(ctx)
    ConfigMapUpdateStep().apply(ctx)
    kube.patch_node_labels(NODE, {PROFILE_LABEL: "old"})
    assert NodeLabelStep().apply(ctx).kind is StepResultKind.DONE
    assert kube.node.labels[PROFILE_LABEL] == "a100-4x"
    assert NodeLabelStep().apply(ctx).detail == "already labelled a100-4x (by this run)"
    assert ctx.load_data("node.label") == {"previous": "old", "changed": True}
    # the label changed, so the config-manager reloads by itself: no restart
    assert DevicePluginRestartStep().apply(ctx).kind is StepResultKind.NOOP
    NodeLabelStep().undo(ctx)
    assert kube.node.labels[PROFILE_LABEL] == "old"


def new_content_under_the_label(kube: FakeKube, journal: Journal) -> StepContext:
    """A node already labelled with the profile, whose content configmap.update has just
    replaced: node.label has nothing to do, so the device plugin must reload it."""
    ref = ("gpu-operator", "time-slicing-config")
    kube.configmaps[ref] = ConfigMap(*ref, data={"a100-4x": "version: v1\n"}, resource_version="1")
    kube.policy["spec"]["devicePlugin"]["config"]["name"] = "time-slicing-config"
    kube.patch_node_labels(NODE, {PROFILE_LABEL: "a100-4x"})
    ctx = slicing_context(kube, journal)
    ConfigMapUpdateStep().apply(ctx)
    assert NodeLabelStep().apply(ctx).kind is StepResultKind.NOOP
    return ctx


def test_the_device_plugin_restarts_only_for_new_content_under_an_old_label(
    kube: FakeKube, journal: Journal
) -> None:
    ctx = new_content_under_the_label(kube, journal)
    plugin = add_pod(
        kube, "plugin-1", owner="DaemonSet", labels={"app": "nvidia-device-plugin-daemonset"}
    )

    def replace_plugin(namespace: str, name: str, *_: Any, **__: Any) -> bool:
        del kube.pods[(namespace, name)]
        add_pod(kube, "plugin-2", owner="DaemonSet", labels=dict(plugin.labels), ready=True)
        return True

    kube.delete_pod = replace_plugin  # type: ignore[method-assign]
    assert_done(DevicePluginRestartStep().apply(ctx), "plugin-2 ready")
    assert ctx.load_data("deviceplugin.restart")["deleted_uid"] == "uid-plugin-1"


def test_a_plugin_being_replaced_is_waited_for_not_restarted(
    kube: FakeKube, journal: Journal
) -> None:
    """No live plugin pod (the DaemonSet replacing one whose config-manager failed, now that
    the profile exists): nothing to delete; its replacement loads the profile."""
    ctx = new_content_under_the_label(kube, journal)
    reads = 0
    listed = kube.list_pods

    def replacing(*args: Any, **kw: Any) -> list[Pod]:
        nonlocal reads
        reads += 1
        if reads == 2:  # the DaemonSet's new pod shows up while the step waits
            labels = {"app": "nvidia-device-plugin-daemonset"}
            add_pod(kube, "plugin-2", owner="DaemonSet", labels=labels, ready=True)
        return listed(*args, **kw)

    kube.list_pods = replacing  # type: ignore[method-assign]
    assert_done(DevicePluginRestartStep().apply(ctx), "plugin-2 ready")
    assert ctx.load_data("deviceplugin.restart") == {"deleted_pod": "", "deleted_uid": ""}

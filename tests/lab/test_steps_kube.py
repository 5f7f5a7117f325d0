"""The Kubernetes and time-slicing steps against the lab: the API emulator through the official
client, with the simulated kubelets, device plugin, scheduler and smoke-pod runner.

Facts come from the real probes (SSH to the nodes) and plans from the real planner. Every
test puts the shared lab back as it found it: uncordoned, unlabelled, pods and budgets gone.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rollout.changes.timeslicing.steps import (
    ConfigMapUpdateStep,
    DevicePluginRestartStep,
    NodeLabelStep,
)
from rollout.connection import FleetConnection
from rollout.facts import FleetFacts, NodeFacts
from rollout.lab.cluster import CONTEXT, Lab
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.run import Journal
from rollout.spec import Spec, parse_spec
from rollout.steps.base import StepContext, StepFailed, StepResultKind
from rollout.steps.cordon import CordonStep, UncordonStep
from rollout.steps.drain import DrainStep
from rollout.steps.gpu_smoke import GpuSmokeStep, smoke_pod_name
from rollout.steps.gpu_wait import GpuWaitStep
from rollout.steps.nodemarks import (
    LEFT_CORDONED_ANNOTATION,
    RUN_ANNOTATION,
    STEP_ANNOTATION,
)
from rollout.transports.errors import NotFound
from rollout.transports.kube import ConfigMap, KubeClient
from rollout.transports.local import LocalRunner
from tests.lab.labapi import Waiting, api_lab
from tests.lab.test_cluster_shared import TEST_GPUS
from tests.podbudgets import create_pod_budget, delete_pod_budget

pytestmark = pytest.mark.lab

# lab-node-1 belongs to the transport tests, lab-node-4 to the incident: these two are ours.
NODE = "lab-node-2"
SLICED_NODE = "lab-node-3"
NAMESPACE = "default"
PROFILE_LABEL = "nvidia.com/device-plugin.config"
OPERATOR_NAMESPACE = "gpu-operator"
GPU = "nvidia.com/gpu"
# Poll the lab's API every 0.2 s, for a minute at most.
wait_for = Waiting(timeout_s=60.0, interval_s=0.2)
DONE, NOOP = StepResultKind.DONE, StepResultKind.NOOP

CONTAINERD_SPEC = f"""
apiVersion: rollout/v1
kind: Plan
metadata: {{name: steps-kube}}
targets: {{nodes: [{NODE}, {SLICED_NODE}]}}
changes:
  - containerd: {{settings: {{enable_cdi: true}}}}
policy:
  drain: {{timeout_s: DRAIN_S}}
  verify: {{gpu_wait_timeout_s: 30, smoke_timeout_s: 30}}
"""
SLICING_SPEC = f"""
apiVersion: rollout/v1
kind: Plan
metadata: {{name: steps-slicing}}
targets: {{nodes: [{SLICED_NODE}]}}
changes:
  - time-slicing:
      configmap: {{namespace: {OPERATOR_NAMESPACE}, name: CONFIGMAP}}
      profile: a100-x
      config:
        sharing:
          timeSlicing:
            resources: [{{name: nvidia.com/gpu, replicas: REPLICAS}}]
policy:
  verify: {{gpu_wait_timeout_s: GPU_WAIT_S, smoke_timeout_s: 30}}
"""


def containerd_spec(drain_timeout_s: int = 30) -> Spec:
    return parse_spec(CONTAINERD_SPEC.replace("DRAIN_S", str(drain_timeout_s)), "steps.yaml")


def slicing_spec(configmap: str, replicas: int, gpu_wait_s: int = 60) -> Spec:
    text = SLICING_SPEC.replace("CONFIGMAP", configmap).replace("REPLICAS", str(replicas))
    return parse_spec(text.replace("GPU_WAIT_S", str(gpu_wait_s)), "slicing.yaml")


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Lab:
    return api_lab(request)


@pytest.fixture(scope="module")
def fleet(lab: Lab) -> FleetFacts:
    """Live facts of the lab, probed over SSH and the API as `rollout plan` does."""
    with FleetConnection(lab.inventory, str(lab.kubeconfig), CONTEXT) as connection:
        return connection.gather(containerd_spec())


@pytest.fixture()
def suffix() -> str:
    return uuid.uuid4().hex[:6]


@pytest.fixture()
def restore(kube: KubeClient) -> Iterator[None]:
    """Put our nodes back: schedulable, no profile label, no rollout annotations."""
    yield
    for node in (NODE, SLICED_NODE):
        kube.set_unschedulable(node, False)
        kube.patch_node_labels(node, {PROFILE_LABEL: None})
        kube.patch_node_annotations(
            node, {RUN_ANNOTATION: None, STEP_ANNOTATION: None, LEFT_CORDONED_ANNOTATION: None}
        )


def make_context(
    kube: KubeClient,
    fleet: FleetFacts,
    tmp_path: Path,
    spec: Spec,
    node: str = NODE,
    facts: NodeFacts | None = None,
    journal: Journal | None = None,
) -> StepContext:
    plan = build_plan(spec, "test", fleet, load_playbooks())
    (node_plan,) = [n for n in plan.nodes if n.name == node]
    node_facts = facts or fleet.by_name(node)
    assert node_facts is not None
    return StepContext(
        node=node,
        node_plan=node_plan,
        facts=node_facts,
        spec=spec,
        runner=LocalRunner(),
        kube=kube,
        journal=journal or Journal.create(tmp_path / "state", spec.metadata.name, "{}"),
        progress=print,
    )


def core_api(kube: KubeClient) -> Any:
    """The official client for what KubeClient does not offer (events, deletes)."""
    from kubernetes import client

    return client.CoreV1Api(client.ApiClient(client.Configuration(host=kube.server)))


def node_events(kube: KubeClient, node: str) -> list[dict[str, Any]]:
    events = core_api(kube).list_namespaced_event(
        NAMESPACE, field_selector=f"involvedObject.name={node}", _preload_content=False
    )
    items: list[dict[str, Any]] = json.loads(events.data)["items"]
    return items


def owned_pod(name: str, node: str, owner: str | None, labels: dict[str, str]) -> dict[str, Any]:
    """A pod bound to `node`; owned by a ReplicaSet-like controller unless owner is None."""
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    if owner is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": owner,
                "uid": str(uuid.uuid4()),
                "controller": True,
            }
        ]
    return {
        "metadata": metadata,
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "busybox:1.36"}],
        },
    }


def gone(kube: KubeClient, name: str) -> bool:
    try:
        kube.get_pod(NAMESPACE, name)
    except NotFound:
        return True
    return False


# ----------------------------------------------------------------------- cordon, uncordon


@pytest.mark.usefixtures("restore")
def test_cordon_journals_and_uncordon_restores(
    kube: KubeClient, fleet: FleetFacts, tmp_path: Path
) -> None:
    ctx = make_context(kube, fleet, tmp_path, containerd_spec())
    assert CordonStep().apply(ctx).kind is StepResultKind.DONE
    node = kube.get_node(NODE)
    assert node.unschedulable
    assert ctx.journal.replay().node(NODE).cordoned_by_rollout
    assert [e.record.kind.value for e in ctx.journal.entries()][-1] == "cordoned-by-rollout"
    assert node.annotations[RUN_ANNOTATION] == ctx.run_id
    assert node.annotations[STEP_ANNOTATION] == "cordon"
    wait_for(
        "the unschedulable taint",
        lambda: any(
            t.key == "node.kubernetes.io/unschedulable" for t in kube.get_node(NODE).taints
        ),
    )
    reasons = [e["reason"] for e in node_events(kube, NODE) if ctx.run_id in e["message"]]
    assert "RolloutCordon" in reasons
    assert CordonStep().apply(ctx).kind is StepResultKind.NOOP  # resume: already done

    assert UncordonStep().apply(ctx).kind is StepResultKind.DONE
    assert not kube.get_node(NODE).unschedulable
    assert not ctx.journal.replay().node(NODE).cordoned_by_rollout
    assert UncordonStep().apply(ctx).kind is StepResultKind.NOOP


@pytest.mark.usefixtures("restore")
def test_a_node_cordoned_by_hand_stays_cordoned(
    kube: KubeClient, fleet: FleetFacts, tmp_path: Path
) -> None:
    kube.set_unschedulable(NODE, True)
    ctx = make_context(kube, fleet, tmp_path, containerd_spec())
    result = CordonStep().apply(ctx)
    assert (result.kind, result.detail) == (
        StepResultKind.NOOP,
        "cordoned by someone else; stays cordoned",
    )
    result = UncordonStep().apply(ctx)
    assert (result.kind, result.detail) == (
        StepResultKind.NOOP,
        "cordoned by someone else; stays cordoned",
    )
    CordonStep().undo(ctx)
    assert kube.get_node(NODE).unschedulable
    assert not ctx.journal.replay().node(NODE).cordoned_by_rollout


# ---------------------------------------------------------------------------------- drain


@pytest.mark.usefixtures("restore")
def test_drain_evicts_managed_pods_and_leaves_operands(
    kube: KubeClient, fleet: FleetFacts, tmp_path: Path, suffix: str
) -> None:
    web, bare = f"web-{suffix}", f"bare-{suffix}"
    operands = {p.name for p in kube.list_pods(OPERATOR_NAMESPACE) if p.node_name == NODE}
    assert operands, "the GPU Operator's DaemonSet pods run on every GPU node"
    ctx = make_context(kube, fleet, tmp_path, containerd_spec())
    CordonStep().apply(ctx)
    kube.create_pod(NAMESPACE, owned_pod(web, NODE, f"web-{suffix}-rs", {"app": web}))
    kube.create_pod(NAMESPACE, owned_pod(bare, NODE, None, {"app": bare}))
    try:
        wait_for("the pods to run", lambda: kube.get_pod(NAMESPACE, web).ready)
        with pytest.raises(StepFailed) as refused:
            DrainStep().apply(ctx)
        assert f"default/{bare}: cannot delete Pods that declare no controller" in str(
            refused.value
        )
        assert "policy.drain.force: true" in str(refused.value)
        assert not gone(kube, web), "a refused drain evicts nothing"
        kube.delete_pod(NAMESPACE, bare, grace_period_s=0)

        result = DrainStep().apply(ctx)
        assert result.kind is StepResultKind.DONE
        assert f"default/{web}" in result.detail
        assert gone(kube, web)
        left = {p.name for p in kube.list_pods(OPERATOR_NAMESPACE) if p.node_name == NODE}
        assert operands <= left, "DaemonSet operand pods are not evicted"
        assert DrainStep().apply(ctx).kind is StepResultKind.NOOP
    finally:
        for name in (web, bare):
            kube.delete_pod(NAMESPACE, name, grace_period_s=0, missing_ok=True)


@pytest.mark.usefixtures("restore")
def test_drain_fails_naming_the_budget_that_blocks_it(
    kube: KubeClient, fleet: FleetFacts, tmp_path: Path, suffix: str
) -> None:
    app = f"db-{suffix}"
    budget = f"{app}-pdb"
    kube.create_pod(NAMESPACE, owned_pod(app, NODE, f"{app}-rs", {"app": app}))
    create_pod_budget(kube, NAMESPACE, budget, app)
    try:
        wait_for("the pod to be ready", lambda: kube.get_pod(NAMESPACE, app).ready)
        wait_for(
            "the budget's status",
            lambda: [b for b in kube.list_pdbs(NAMESPACE) if b.name == budget and b.expected_pods],
        )
        ctx = make_context(kube, fleet, tmp_path, containerd_spec(drain_timeout_s=3))
        started = time.monotonic()
        with pytest.raises(StepFailed) as blocked:
            DrainStep().apply(ctx)
        assert time.monotonic() - started < 15
        assert (
            f"drain of {NODE} timed out after 3s: pod default/{app} is protected by "
            f"PodDisruptionBudget default/{budget} (0 disruptions allowed)"
        ) in str(blocked.value)
        assert kube.get_pod(NAMESPACE, app).phase == "Running"
    finally:
        delete_pod_budget(kube, NAMESPACE, budget)
        kube.delete_pod(NAMESPACE, app, grace_period_s=0, missing_ok=True)


# ------------------------------------------------------------------------ gpu.wait, smoke


@pytest.mark.usefixtures("restore")
def test_gpu_wait_passes_on_a_healthy_node_and_explains_a_shortfall(
    kube: KubeClient, fleet: FleetFacts, tmp_path: Path
) -> None:
    ctx = make_context(kube, fleet, tmp_path, containerd_spec())
    result = GpuWaitStep().apply(ctx)
    assert result.kind is StepResultKind.DONE
    assert f"allocatable {GPU} = {TEST_GPUS}" in result.detail

    # A profile that was never selected on the node: the count cannot come.
    spec = slicing_spec("never-written", replicas=4, gpu_wait_s=2)
    ctx = make_context(kube, fleet, tmp_path, spec, node=SLICED_NODE)
    started = time.monotonic()
    with pytest.raises(StepFailed) as short:
        GpuWaitStep().apply(ctx)
    assert time.monotonic() - started < 10
    message = str(short.value)
    assert f"expected {GPU} = {TEST_GPUS * 4} ({TEST_GPUS} GPUs x 4 replicas)" in message
    assert f"capacity {TEST_GPUS}, allocatable {TEST_GPUS}" in message
    assert "device plugin pod gpu-operator/nvidia-device-plugin-daemonset-" in message


@pytest.mark.usefixtures("restore")
def test_gpu_smoke_runs_on_the_cordoned_node_and_checks_uuids(
    kube: KubeClient, fleet: FleetFacts, tmp_path: Path
) -> None:
    ctx = make_context(kube, fleet, tmp_path, containerd_spec())
    node_uuids = set(ctx.facts.gpus.uuids)
    assert len(node_uuids) == TEST_GPUS
    CordonStep().apply(ctx)  # as in the playbook: the node is still cordoned here
    result = GpuSmokeStep().apply(ctx)
    assert result.kind is StepResultKind.DONE
    listed = [u for u in node_uuids if u in result.detail]
    assert len(listed) == 1, result.detail  # a one-GPU pod sees exactly one of the node's GPUs
    name = smoke_pod_name(NODE, ctx.run_id)
    assert gone(kube, name)

    # Facts naming other GPUs: the check must catch a pod that saw the wrong ones.
    strangers = replace(
        ctx.facts.gpus, uuids=tuple(f"GPU-{uuid.uuid4()}" for _ in range(TEST_GPUS))
    )
    wrong = make_context(
        kube,
        fleet,
        tmp_path,
        containerd_spec(),
        facts=replace(ctx.facts, gpus=strangers),
        journal=ctx.journal,
    )
    with pytest.raises(StepFailed) as failed:
        GpuSmokeStep().apply(wrong)
    assert "is not one of the node's GPUs" in str(failed.value)
    assert gone(kube, name), "the smoke pod is deleted on failure too"


# ---------------------------------------------------------------------------- time-slicing


def apply_all(ctx: StepContext) -> list[StepResultKind]:
    steps = (ConfigMapUpdateStep(), NodeLabelStep(), DevicePluginRestartStep(), GpuWaitStep())
    return [step.apply(ctx).kind for step in steps]


def undo_all(ctx: StepContext) -> None:
    for step in (DevicePluginRestartStep(), NodeLabelStep(), ConfigMapUpdateStep()):
        step.undo(ctx)


@pytest.mark.usefixtures("restore")
def test_time_slicing_advertises_replicas_and_undo_restores(
    kube: KubeClient, fleet: FleetFacts, tmp_path: Path, suffix: str
) -> None:
    name = f"slicing-{suffix}"
    policy_name = kube.list_cluster_policies()[0]["metadata"]["name"]
    kube.create_configmap(ConfigMap(OPERATOR_NAMESPACE, name, data={"other": "version: v1\n"}))
    first = make_context(kube, fleet, tmp_path, slicing_spec(name, 4), node=SLICED_NODE)
    try:
        kinds = apply_all(first)
        # the label change reloads the plugin by itself: no restart
        assert kinds == [DONE, DONE, NOOP, DONE]
        node = kube.get_node(SLICED_NODE)
        assert node.allocatable[GPU] == str(TEST_GPUS * 4)
        assert node.labels[PROFILE_LABEL] == "a100-x"
        assert set(kube.get_configmap(OPERATOR_NAMESPACE, name).data) == {"other", "a100-x"}
        assert GpuSmokeStep().apply(first).kind is StepResultKind.DONE

        # A second run changes the profile's content under the label the node already has:
        # only a device-plugin restart makes it count (gpu-operator issue 1144).
        second = make_context(kube, fleet, tmp_path, slicing_spec(name, 2), node=SLICED_NODE)
        kinds = apply_all(second)
        assert kinds == [DONE, NOOP, DONE, DONE]
        assert kube.get_node(SLICED_NODE).allocatable[GPU] == str(TEST_GPUS * 2)

        undo_all(second)  # back to 4 replicas: the undo restarts the plugin itself
        assert GpuWaitStep().apply(first).kind is StepResultKind.DONE
        assert kube.get_node(SLICED_NODE).allocatable[GPU] == str(TEST_GPUS * 4)
        undo_all(first)
        node = kube.get_node(SLICED_NODE)
        assert PROFILE_LABEL not in node.labels
        configmap = kube.get_configmap(OPERATOR_NAMESPACE, name)
        assert dict(configmap.data) == {"other": "version: v1\n"}
        policy = kube.get_cluster_policy(policy_name)
        assert policy["spec"]["devicePlugin"]["config"]["name"] == ""
        back = make_context(kube, fleet, tmp_path, containerd_spec(), node=SLICED_NODE)
        assert GpuWaitStep().apply(back).kind is StepResultKind.DONE
    finally:
        kube.patch_node_labels(SLICED_NODE, {PROFILE_LABEL: None})
        kube.patch_cluster_policy(policy_name, {"spec": {"devicePlugin": {"config": {"name": ""}}}})
        core_api(kube).delete_namespaced_config_map(name, OPERATOR_NAMESPACE)

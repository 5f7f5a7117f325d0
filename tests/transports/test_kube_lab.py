"""KubeClient against the lab's API emulator with the lab's kubeconfig (simulated kubelets)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from rollout.lab.cluster import Lab
from rollout.transports.errors import Conflict, EvictionBlocked, NotFound
from rollout.transports.kube import KubeClient, Lease, Pod
from tests.lab.labapi import Waiting, api_lab, lab_kube_client
from tests.lab.test_cluster_shared import TEST_GPUS
from tests.podbudgets import create_pod_budget, delete_pod_budget

pytestmark = pytest.mark.lab

NODE = "lab-node-1"
NAMESPACE = "default"
GPU = "nvidia.com/gpu"
# The lab's simulated cluster reacts in well under a second; this much is a failure.
wait_for = Waiting(timeout_s=30.0, interval_s=0.2)


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Lab:
    return api_lab(request)


@pytest.fixture(scope="module")
def kube(lab: Lab) -> Iterator[KubeClient]:
    with lab_kube_client(lab) as kube:
        yield kube


@pytest.fixture()
def suffix() -> str:
    return uuid.uuid4().hex[:6]


def pod_manifest(name: str, labels: dict[str, str], **container: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": NODE,
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox:1.36", **container}],
        },
    }


def test_lists_the_lab_nodes(lab: Lab, kube: KubeClient) -> None:
    nodes = kube.list_nodes()
    assert [n.name for n in nodes] == [n.name for n in lab.nodes]
    gpu_nodes = kube.list_nodes("nvidia.com/gpu.present=true")
    assert {n.name for n in gpu_nodes} == {n.name for n in lab.nodes}
    assert kube.get_node(NODE).container_runtime_version.startswith("containerd://1.6")


def test_patch_labels_and_cordon(kube: KubeClient, suffix: str) -> None:
    key = f"rollout.test/{suffix}"
    try:
        assert kube.patch_node_labels(NODE, {key: "draining"}).labels[key] == "draining"
        assert kube.set_unschedulable(NODE, True).unschedulable
        assert kube.get_node(NODE).unschedulable
    finally:
        kube.set_unschedulable(NODE, False)
        kube.patch_node_labels(NODE, {key: None})
    node = kube.get_node(NODE)
    assert not node.unschedulable and key not in node.labels


def test_a_smoke_pod_runs_and_logs_its_gpus(kube: KubeClient, suffix: str) -> None:
    wait_for("GPUs on the node", lambda: int(kube.get_node(NODE).allocatable.get(GPU, "0")))
    name = f"smoke-{suffix}"
    kube.create_pod(
        NAMESPACE,
        pod_manifest(
            name,
            {"app": "rollout-smoke"},
            command=["nvidia-smi", "-L"],
            resources={"limits": {GPU: str(TEST_GPUS)}},
        ),
    )
    try:

        def finished() -> Pod | None:
            pod = kube.get_pod(NAMESPACE, name)
            return pod if pod.phase in ("Succeeded", "Failed") else None

        pod = wait_for("the smoke pod to finish", finished)
        assert pod.phase == "Succeeded", (pod.reason, pod.message)
        log = kube.read_pod_log(NAMESPACE, name)
        assert [line.split(":")[0] for line in log.splitlines()] == [
            f"GPU {i}" for i in range(TEST_GPUS)
        ]
    finally:
        kube.delete_pod(NAMESPACE, name, grace_period_s=0, missing_ok=True)


def test_an_eviction_blocked_by_a_budget_names_it(kube: KubeClient, suffix: str) -> None:
    app = f"web-{suffix}"
    names = [f"{app}-{i}" for i in range(2)]
    budget = f"{app}-pdb"
    for name in names:
        kube.create_pod(NAMESPACE, pod_manifest(name, {"app": app}))
    create_pod_budget(kube, NAMESPACE, budget, app, min_available=2)
    try:
        wait_for(
            "the pods to be ready",
            lambda: all(p.ready for p in kube.list_pods(NAMESPACE, f"app={app}")),
        )
        wait_for(
            "the budget's status",
            lambda: [b for b in kube.list_pdbs(NAMESPACE) if b.name == budget and b.expected_pods],
        )
        with pytest.raises(EvictionBlocked) as blocked:
            kube.evict_pod(NAMESPACE, names[0])
        assert blocked.value.pdb == budget
        assert f"evict pod {NAMESPACE}/{names[0]}: 429" in str(blocked.value)
        assert kube.get_pod(NAMESPACE, names[0]).phase == "Running"
    finally:
        delete_pod_budget(kube, NAMESPACE, budget)
        for name in names:
            kube.delete_pod(NAMESPACE, name, grace_period_s=0, missing_ok=True)


def test_a_stale_lease_is_a_conflict(kube: KubeClient, suffix: str) -> None:
    now = datetime.now(UTC)
    name = f"rollout-test-{suffix}"
    created = kube.create_lease(
        Lease("kube-system", name, holder_identity="run-1", lease_duration_s=30, renew_time=now)
    )
    kube.replace_lease(replace(created, renew_time=datetime.now(UTC)))
    with pytest.raises(Conflict) as stale:
        kube.replace_lease(replace(created, holder_identity="run-2"))
    assert stale.value.status == 409
    assert kube.get_lease("kube-system", name).holder_identity == "run-1"


def test_missing_objects_are_not_found(kube: KubeClient) -> None:
    with pytest.raises(NotFound) as node:
        kube.get_node("lab-node-99")
    assert str(node.value).startswith("get node lab-node-99: 404")
    with pytest.raises(NotFound):
        kube.get_pod(NAMESPACE, "no-such-pod")
    with pytest.raises(NotFound):
        kube.get_configmap(NAMESPACE, "no-such-configmap")

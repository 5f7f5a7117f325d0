"""The canonical incident of DESIGN.md, end to end in the lab.

On a containerd 1.7 node a naive registry drop-in replaces the whole CRI plugin table, the
`nvidia` handler vanishes from the running config, the device plugin stops advertising GPUs
(allocatable 0) and a GPU pod pinned to the node stays Pending with `Insufficient
nvidia.com/gpu` -- seen through the official Kubernetes client with the lab's kubeconfig.
"""

from __future__ import annotations

import tomllib
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from rollout.lab.cluster import Lab
from rollout.lab.nodes import RUNNING_RECORD
from tests.conftest import require
from tests.lab.labapi import api_lab, wait_for
from tests.lab.test_cluster_shared import INCIDENT_NODE, TEST_GPUS, ssh_check

REGISTRY_DROP_IN = "/etc/containerd/conf.d/registry.toml"
NAIVE_REGISTRY = (
    '[plugins."io.containerd.grpc.v1.cri".registry]\nconfig_path = "/etc/containerd/certs.d"\n'
)
GPU = "nvidia.com/gpu"
WAIT_S = 60.0
T = TypeVar("T")


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Lab:
    lab = api_lab(request)
    if (
        not (lab.lab_dir / "controlplane.pid").exists()
        and not (lab.lab_dir / ".controlplane-launch.pid").exists()
    ):
        require("the shared lab was brought up without its control plane")
    return lab


@pytest.fixture(scope="module")
def core(lab: Lab) -> Any:
    from kubernetes import client, config

    api = config.new_client_from_config(str(lab.kubeconfig), context="rollout-lab")
    return client.CoreV1Api(api)


def settle(what: str, probe: Callable[[], T | None]) -> T:
    """Wait for the simulated cluster, which reacts in seconds rather than milliseconds."""
    return wait_for(probe, WAIT_S, what=what, interval_s=0.5)


def allocatable_gpus(core: Any, node: str) -> str | None:
    allocatable = core.read_node(node).status.allocatable or {}
    value = allocatable.get(GPU)
    return None if value is None else str(value)


@pytest.fixture
def broken_node(lab: Lab) -> Iterator[str]:
    """The incident node with the naive registry drop-in; restored afterwards."""
    node = lab.find_node(INCIDENT_NODE)
    assert node.containerd == "1.7"
    try:
        yield node.name
    finally:
        ssh_check(lab, node, ["rm", "-f", REGISTRY_DROP_IN])
        ssh_check(lab, node, ["systemctl", "restart", "containerd"])


@pytest.mark.lab
def test_the_lab_nodes_advertise_their_gpus(lab: Lab, core: Any) -> None:
    settle(
        "every lab node to advertise its GPUs",
        lambda: all(allocatable_gpus(core, n.name) == str(TEST_GPUS) for n in lab.nodes),
    )
    names = {item.metadata.name for item in core.list_node().items}
    assert {n.name for n in lab.nodes} <= names
    for item in core.list_node().items:
        if item.metadata.name in names:
            assert item.status.capacity[GPU] == str(TEST_GPUS)


@pytest.mark.lab
def test_a_naive_registry_drop_in_takes_the_gpus_away(
    lab: Lab, core: Any, broken_node: str
) -> None:
    node = lab.find_node(broken_node)
    settle("GPUs before the change", lambda: allocatable_gpus(core, node.name) == str(TEST_GPUS))

    ssh_check(lab, node, ["tee", REGISTRY_DROP_IN], stdin=NAIVE_REGISTRY.encode())
    ssh_check(lab, node, ["systemctl", "restart", "containerd"])

    # The running config lost the handler although every file still looks fine.
    record = lab.node_dirs(node).host_path(RUNNING_RECORD)

    def record_without_nvidia() -> bool:
        if not record.is_file():
            return False
        cri = tomllib.loads(record.read_text())["plugins"]["io.containerd.grpc.v1.cri"]
        return "nvidia" not in cri["containerd"]["runtimes"]

    settle("the running config without the nvidia handler", record_without_nvidia)
    assert "nvidia" in ssh_check(lab, node, ["cat", "/etc/containerd/conf.d/99-nvidia.toml"])

    settle("allocatable nvidia.com/gpu 0", lambda: allocatable_gpus(core, node.name) == "0")

    from kubernetes import client

    name = f"gpu-probe-{uuid.uuid4().hex[:6]}"
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace="default"),
        spec=client.V1PodSpec(
            node_selector={"kubernetes.io/hostname": node.name},
            restart_policy="Never",
            containers=[
                client.V1Container(
                    name="cuda",
                    image="nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04",
                    command=["nvidia-smi", "-L"],
                    resources=client.V1ResourceRequirements(limits={GPU: "1"}),
                )
            ],
        ),
    )
    core.create_namespaced_pod("default", pod)
    try:

        def unschedulable_message() -> str | None:
            status = core.read_namespaced_pod(name, "default").status
            for condition in status.conditions or []:
                if condition.type == "PodScheduled" and condition.status == "False":
                    return str(condition.message or "")
            return None

        message = settle("the pod to be reported unschedulable", unschedulable_message)
        assert f"Insufficient {GPU}" in message
        assert core.read_namespaced_pod(name, "default").status.phase == "Pending"
    finally:
        core.delete_namespaced_pod(name, "default")

"""The cluster as it stands when the lab control plane starts: nodes, operator, policy."""

from __future__ import annotations

import platform
import uuid
from importlib import resources
from typing import Any

import yaml

from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import (
    ALL_KINDS,
    CLUSTERPOLICIES,
    CONFIGMAPS,
    DAEMONSETS,
    NODES,
    RUNTIMECLASSES,
)
from rollout.lab.description import LabDescription, NodeDescription
from rollout.lab.simulation.gpuoperator import (
    CLUSTER_POLICY_NAME,
    DEPLOY_COMPONENTS,
    DEPLOY_LABEL_PREFIX,
    DRIVER,
    GPU_PRESENT_LABEL,
    MIG_CONFIGMAP,
    MIG_MANAGER,
    NVIDIA_HANDLER,
    OPERANDS,
    OPERATOR_NAMESPACE,
    to_cluster_policy,
    to_daemonset,
    uses_driver_crd,
)
from rollout.lab.simulation.miglayouts import (
    CAPABLE_LABEL,
    CONFIG_LABEL,
    DISABLED_CONFIG,
    MIG_CAPABLE_PRODUCTS,
    STATE_LABEL,
    to_configmap_data,
)

KUBELET_VERSION = "v1.31.0"
NODE_CAPACITY = {
    "cpu": "8",
    "memory": "32853264Ki",
    "pods": "110",
    "ephemeral-storage": "102626232Ki",
    "hugepages-1Gi": "0",
    "hugepages-2Mi": "0",
}
NODE_ALLOCATABLE = {**NODE_CAPACITY, "memory": "32750864Ki", "ephemeral-storage": "94580335255"}
# rollout's least-privilege ServiceAccount, ClusterRole, Roles and bindings (docs/permissions.md)
RBAC_MANIFEST = "rbac.yaml"


def seed_cluster(registry: Registry, lab: LabDescription) -> None:
    """Create what a freshly installed GPU Operator cluster has; existing objects are kept."""
    registry.ensure_namespace(OPERATOR_NAMESPACE)
    for index, node in enumerate(lab.nodes):
        _create_quietly(registry, NODES, None, to_node(node, index))
    driver_version = next((n.driver_version for n in lab.nodes if n.driver_version), "")
    # with NVIDIADriver resources the ClusterPolicy runs no driver DaemonSet of its own
    crd = uses_driver_crd(registry.find(CLUSTERPOLICIES, None, CLUSTER_POLICY_NAME))
    for operand in OPERANDS if not crd else [o for o in OPERANDS if o is not DRIVER]:
        _create_quietly(
            registry, DAEMONSETS, OPERATOR_NAMESPACE, to_daemonset(operand, driver_version)
        )
    _create_quietly(registry, CLUSTERPOLICIES, None, to_cluster_policy(driver_version))
    _create_quietly(registry, CONFIGMAPS, OPERATOR_NAMESPACE, to_mig_configmap())
    # The operator's RuntimeClass (ClusterPolicy operator.runtimeClass): pods naming it pass
    # admission; the handler is resolved by each node's containerd.
    _create_quietly(registry, RUNTIMECLASSES, None, to_runtime_class(NVIDIA_HANDLER))
    seed_rollout_access(registry)


def read_rbac_manifest() -> list[dict[str, Any]]:
    """The objects of the manifest docs/permissions.md documents, as `kubectl apply` reads it."""
    text = resources.files("rollout.lab").joinpath("data", RBAC_MANIFEST).read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc]


def seed_rollout_access(registry: Registry) -> None:
    """Create the manifest's objects (and their namespaces), as a user applying it would."""
    kinds = {(k.api_version, k.kind): k for k in ALL_KINDS}
    for obj in read_rbac_manifest():
        kind = kinds[(obj["apiVersion"], obj["kind"])]
        namespace = obj["metadata"].get("namespace") if kind.namespaced else None
        if namespace:
            registry.ensure_namespace(namespace)
        _create_quietly(registry, kind, namespace, obj)


def to_mig_configmap() -> dict[str, Any]:
    """The MIG manager's layouts, as the GPU Operator's chart installs its default config."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": MIG_CONFIGMAP, "namespace": OPERATOR_NAMESPACE},
        "data": to_configmap_data(),
    }


def to_runtime_class(handler: str) -> dict[str, Any]:
    """The RuntimeClass the GPU Operator creates, named after its handler."""
    return {
        "apiVersion": RUNTIMECLASSES.api_version,
        "kind": RUNTIMECLASSES.kind,
        "metadata": {"name": handler},
        "handler": handler,
    }


def to_node(node: NodeDescription, index: int) -> dict[str, Any]:
    """The Node object the node's kubelet registers (GPU resources come with the plugin)."""
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
    }
    if node.gpus:
        labels[GPU_PRESENT_LABEL] = "true"
        labels.update({f"{DEPLOY_LABEL_PREFIX}{c}": "true" for c in DEPLOY_COMPONENTS})
    if node.gpus and all(g.product in MIG_CAPABLE_PRODUCTS for g in node.gpus):
        # GFD's capability label, and the MIG manager's default layout, already applied
        labels.update(
            {
                CAPABLE_LABEL: "true",
                CONFIG_LABEL: DISABLED_CONFIG,
                STATE_LABEL: "success",
                MIG_MANAGER.deploy_label: "true",
            }
        )
    system_uuid = str(uuid.uuid5(uuid.NAMESPACE_DNS, node.name))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": labels,
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {"podCIDR": f"10.244.{index}.0/24", "podCIDRs": [f"10.244.{index}.0/24"]},
        "status": {
            "capacity": dict(NODE_CAPACITY),
            "allocatable": dict(NODE_ALLOCATABLE),
            "conditions": [],
            "addresses": [
                {"type": "InternalIP", "address": node.address},
                {"type": "Hostname", "address": node.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": system_uuid.replace("-", ""),
                "systemUUID": system_uuid,
                "bootID": str(uuid.uuid4()),
                "kernelVersion": platform.release(),
                "osImage": "Debian GNU/Linux 12 (bookworm)",
                "containerRuntimeVersion": f"containerd://{node.containerd}",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def _create_quietly(
    registry: Registry, kind: Any, namespace: str | None, obj: dict[str, Any]
) -> None:
    try:
        registry.create(kind, namespace, obj)
    except ApiError as error:
        if error.code != 409:
            raise

"""What diagnose reads off the facts: numbers and names the checks of several branches share.

Pure functions over NodeFacts and ClusterFacts; nothing here decides whether a node is
broken, the checks do.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from rollout.containerd import ContainerdConfigError, merge_files
from rollout.containerd.files import parse_toml
from rollout.containerd.runtimehandlers import list_runtime_handlers
from rollout.deviceprofiles import (
    DEVICE_PLUGIN_CONFIG_LABEL,
    fallback_key,
    load_profile,
    renames_by_default,
    shared_replicas,
)
from rollout.facts import ClusterFacts, NodeFacts
from rollout.facts.gpu_operator import (
    GPU_PRESENT_LABEL,
    DevicePluginConfigRef,
    current_replicas,
)
from rollout.facts.pods import GPU_RESOURCE, PodFacts, is_gpu_resource, quantity_value
from rollout.transports.kube import ContainerStatus

FINISHED_PHASES = ("Succeeded", "Failed")


def describe_container(status: ContainerStatus) -> str:
    """`driver-validation: waiting (CrashLoopBackOff), 4 restart(s)`."""
    return (
        f"{status.name}: {status.state}"
        + (f" ({status.reason})" if status.reason else "")
        + (f", {status.restart_count} restart(s)" if status.restart_count else "")
    )


def q(word: str) -> str:
    """A word quoted for the shell commands findings suggest."""
    return shlex.quote(word)


def is_gpu_node(node: NodeFacts) -> bool:
    return (
        node.gpus.count > 0
        or node.labels.get(GPU_PRESENT_LABEL) == "true"
        or any(is_gpu_resource(r) for r in node.capacity)
    )


def gpu_resources(node: NodeFacts) -> list[str]:
    """The GPU resources the node's status names, `nvidia.com/gpu` first."""
    names = {r for r in (*node.capacity, *node.allocatable) if is_gpu_resource(r)}
    return sorted(names, key=lambda r: (r != GPU_RESOURCE, r))


def amount(values: Mapping[str, str], resource: str) -> int:
    return int(quantity_value(values.get(resource, "0")))


def pods_on(node: NodeFacts, cluster: ClusterFacts) -> list[PodFacts]:
    """The pods bound to the node that still hold their resources."""
    return [p for p in cluster.pods if p.node_name == node.name and p.phase not in FINISHED_PHASES]


def allocated(node: NodeFacts, cluster: ClusterFacts, resource: str) -> tuple[int, list[str]]:
    """How much of `resource` the node's pods hold, and which pods (`ns/name: n`)."""
    total = 0
    holders: list[str] = []
    for pod in pods_on(node, cluster):
        if pod.spec_known:
            held = int(quantity_value(pod.gpu_resources.get(resource, "0")))
        else:
            held = pod.gpu_request if resource == GPU_RESOURCE else 0
        if held:
            total += held
            holders.append(f"{pod.key}: {held}")
    return total, holders


@dataclass(frozen=True)
class Profile:
    """The time-slicing profile the node's config-manager loads, as far as the facts tell."""

    configmap: str  # namespace/name, "" when the ClusterPolicy names none
    key: str | None  # the key it loads; None: no config (no sharing)
    labelled: bool  # chosen by the node's label, not by a fallback
    missing: bool  # the label (or config.default) names a key the ConfigMap lacks
    replicas: int
    renamed: bool  # renameByDefault: advertised as nvidia.com/gpu.shared
    known: bool  # the ConfigMap is among the facts


def node_profile(node: NodeFacts, cluster: ClusterFacts) -> Profile:
    config = DevicePluginConfigRef.from_policy(cluster.cluster_policy)
    configmap = config.configmap
    label = node.labels.get(DEVICE_PLUGIN_CONFIG_LABEL)
    data = cluster.configmaps.get(configmap) if configmap else None
    if data is None:
        replicas = current_replicas(node)
        return Profile(configmap, label, bool(label), False, replicas, False, False)
    key = label or fallback_key(config.default, list(data))
    if key is None:
        return Profile(configmap, None, False, False, 1, False, True)
    if key not in data:
        return Profile(configmap, key, bool(label), True, 1, False, True)
    document = load_profile(data[key])
    shared = shared_replicas(document, GPU_RESOURCE)
    renamed = shared is not None and renames_by_default(document)
    return Profile(configmap, key, bool(label), False, shared or 1, renamed, True)


def file_handlers(node: NodeFacts, path: str) -> set[str]:
    """The handlers one of the node's files defines (empty when it does not parse)."""
    try:
        return set(list_runtime_handlers(parse_toml(path, node.config_files.files[path])))
    except (ContainerdConfigError, KeyError):
        return set()


def modelled_handlers(node: NodeFacts) -> set[str] | None:
    """The handlers the node's files give on its containerd version; None: they do not load."""
    try:
        return set(list_runtime_handlers(merge_files(node.config_files, node.containerd).tree))
    except ContainerdConfigError:
        return None
